package arbiterlock

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Defaults: client-go's and controller-runtime's leader election timings.
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
	// DefaultStepDownGrace matches controller-runtime's default GracefulShutdownTimeout.
	DefaultStepDownGrace = 30 * time.Second
	// Margin is the least time between the moment client-go's elector must have stopped
	// leading (retry period + renew deadline after its last renewal) and the lease's expiry.
	Margin = time.Second
)

// Options says who this replica is and how it renews. LeaseName and BinaryVersion are required;
// the rest has defaults.
type Options struct {
	// LeaseName is the coordination.k8s.io Lease the arbiter assigns (in controller-runtime,
	// the LeaderElectionID).
	LeaseName string
	// Namespace of the Lease and the candidate. Default: $POD_NAMESPACE.
	Namespace string
	// Identity is this replica's name: its LeaseCandidate's and the Lease's holderIdentity.
	// Default: $POD_NAME, else the host name.
	Identity string
	// BinaryVersion is this replica's version (semver, e.g. "1.31.0").
	BinaryVersion string
	// EmulationVersion is the version it behaves as; default BinaryVersion under
	// OldestEmulationVersion.
	EmulationVersion string
	// Strategy, default OldestEmulationVersion.
	Strategy string
	// Instance is the arbiter install that arbitrates this candidate (label
	// arbiter.dev/instance); empty for an install without --instance.
	Instance string
	// PodName and PodUID: the pod this replica runs in, so that its candidate is owned by
	// (garbage-collected with) the pod and its stop ends the term at once. Default: $POD_NAME and
	// $POD_UID.
	PodName, PodUID string
	// TerminationLog is the container's termination log; the replica records its incarnation
	// there when it starts, so that a crash of its container hands the lease on at once. Written
	// only if it exists and the container has a PID namespace of its own. Default:
	// /dev/termination-log; "-" turns it off.
	TerminationLog string

	// LeaseDuration, RenewDeadline and RetryPeriod must be the elector's (use
	// Lock.LeaderElectionConfig, or arbiterctrl.Options for controller-runtime). The lock
	// refuses timings that let the elector lead past the lease's expiry:
	// RetryPeriod + RenewDeadline + Margin must not exceed LeaseDuration.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// StepDownGrace is how long the lock keeps renewing after the arbiter asked this leader to
	// hand over, while the program stops its work (only when the program watches
	// StepDownContext). It should cover the program's graceful shutdown
	// (controller-runtime's GracefulShutdownTimeout). Default 30 s.
	StepDownGrace time.Duration

	// OnStartedTerm is called when this replica takes a term (the fencing token).
	OnStartedTerm func(term int32)
	// OnEndedTerm is called when the lock ends the term (work guarded by it must stop).
	OnEndedTerm func(term int32, reason string)
	// EventRecorder, optional, receives the elector's events ("became leader", ...).
	EventRecorder resourcelock.EventRecorder
}

// semverRE is semver.org's regular expression (the CRD checks the same).
var semverRE = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)

// withDefaults fills what the environment or the defaults say, and checks the rest.
func (o Options) withDefaults() (Options, error) {
	env := func(v *string, key string) {
		if *v == "" {
			*v = os.Getenv(key)
		}
	}
	env(&o.Namespace, "POD_NAMESPACE")
	env(&o.Identity, "POD_NAME")
	env(&o.PodName, "POD_NAME")
	env(&o.PodUID, "POD_UID")
	if o.Identity == "" {
		h, err := os.Hostname()
		if err != nil {
			return o, fmt.Errorf("arbiterlock: no Identity, no $POD_NAME, and no host name: %w", err)
		}
		o.Identity = strings.ToLower(h)
	}
	if o.Strategy == "" {
		o.Strategy = OldestEmulationVersion
	}
	if o.EmulationVersion == "" && o.Strategy == OldestEmulationVersion {
		o.EmulationVersion = o.BinaryVersion
	}
	if o.TerminationLog == "" {
		o.TerminationLog = "/dev/termination-log"
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&o.LeaseDuration, DefaultLeaseDuration)
	def(&o.RenewDeadline, DefaultRenewDeadline)
	def(&o.RetryPeriod, DefaultRetryPeriod)
	def(&o.StepDownGrace, DefaultStepDownGrace)
	return o, o.check()
}

func (o Options) check() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if o.LeaseName == "" {
		bad("LeaseName is required")
	} else if !validIdentity(o.LeaseName) {
		bad("LeaseName %q is not a Lease name (lowercase letters, digits, '-' and '.')", o.LeaseName)
	}
	if o.Namespace == "" {
		bad("Namespace is required (or $POD_NAMESPACE)")
	}
	if !validIdentity(o.Identity) {
		bad("Identity %q is not a LeaseCandidate name (lowercase letters, digits, '-' and '.')", o.Identity)
	}
	if !semverRE.MatchString(o.BinaryVersion) {
		bad("BinaryVersion %q is not a semantic version such as 1.31.0", o.BinaryVersion)
	}
	if o.EmulationVersion != "" && !semverRE.MatchString(o.EmulationVersion) {
		bad("EmulationVersion %q is not a semantic version such as 1.31.0", o.EmulationVersion)
	}
	if (o.PodName == "") != (o.PodUID == "") {
		bad("PodName and PodUID go together (set $POD_NAME and $POD_UID from the downward API)")
	}
	if err := checkTimings(o.LeaseDuration, o.RenewDeadline, o.RetryPeriod); err != nil {
		errs = append(errs, err)
	}
	if o.StepDownGrace < 0 {
		bad("StepDownGrace (%v) must not be negative", o.StepDownGrace)
	}
	if len(errs) > 0 {
		return fmt.Errorf("arbiterlock: %w", errors.Join(errs...))
	}
	return nil
}

// checkTimings refuses timings under which client-go's elector could lead past the lease's
// expiry. The elector stops leading at most a retry period plus its renew deadline after its
// last successful renewal returned; the arbiter reassigns a lease duration after it saw that
// renewal. The lock counts a renewal only if it returned within LeaseDuration - RenewDeadline -
// RetryPeriod - Margin/2 of being sent (see maxRenewLatency), so that bound holds from the send.
func checkTimings(lease, deadline, retry time.Duration) error {
	switch {
	case retry <= 0 || deadline <= retry || lease <= deadline:
		return fmt.Errorf("timings must satisfy 0 < RetryPeriod (%v) < RenewDeadline (%v) < LeaseDuration (%v)", retry, deadline, lease)
	case lease%time.Second != 0:
		return fmt.Errorf("LeaseDuration (%v) must be whole seconds: a Lease holds leaseDurationSeconds", lease)
	case retry+deadline+Margin > lease:
		return fmt.Errorf("unsafe timings: the elector may lead for RetryPeriod + RenewDeadline (%v) after its last renewal, which must be at least %v less than LeaseDuration (%v), when the arbiter may name another holder", retry+deadline, Margin, lease)
	}
	return nil
}

// maxRenewLatency is how long a renewal may take, from send to answer, and still count: the
// elector measures its renew deadline from the answer, the arbiter its lease duration from the
// write.
func maxRenewLatency(o Options) time.Duration {
	return o.LeaseDuration - o.RenewDeadline - o.RetryPeriod - Margin/2
}
