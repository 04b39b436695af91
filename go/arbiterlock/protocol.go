package arbiterlock

import (
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The marks of arbiter's Lease protocol, as the Rust agent and the operator write and read them
// (docs/concepts/lease-protocol.md). One protocol, two implementations: a change here is a
// change to the protocol, and the e2e tests run both against the same operator.
const (
	// FieldManager is the field manager of every Lease write: the operator trusts a release, an
	// incarnation and a pod record only when its field manager wrote them.
	FieldManager = "arbiter"
	// ManagedLabel is on every Lease the operator manages.
	ManagedLabel = "arbiter.dev/managed"
	// InstanceLabel names the arbiter install that arbitrates a candidate.
	InstanceLabel = "arbiter.dev/instance"

	assignedAnnotation        = "arbiter.dev/assigned"
	incarnationAnnotation     = "arbiter.dev/holder-incarnation"
	takenInPodAnnotation      = "arbiter.dev/taken-in-pod"
	holderPodAnnotation       = "arbiter.dev/holder-pod-uid"
	preferredHolderAnnotation = "arbiter.dev/preferred-holder"
	releasedByAnnotation      = "arbiter.dev/released-by"
	leaseDurationAnnotation   = "arbiter.dev/lease-duration-seconds"
	overranAnnotation         = "arbiter.dev/overran-term"
	withdrawnAnnotation       = "arbiter.dev/withdrawn"

	// OldestEmulationVersion is the default strategy (KEP-4355's).
	OldestEmulationVersion = "OldestEmulationVersion"
)

// standing is what a Lease says about this process.
type standing int

const (
	// other: not assigned to this identity.
	other standing = iota
	// ours: assigned to this identity and free to take (a fresh assignment, or already ours).
	ours
	// stale: names this identity but an earlier process of it took the term: never resumed.
	stale
	// otherPod: a fresh assignment made while another pod of this name ran.
	otherPod
	// unassigned: names this identity, but the arbiter did not assign it (no label and
	// assignment mark): a Lease made or edited by hand, or a plain client-go Lease.
	unassigned
	// handover: ours, and the arbiter asks for a handover to someone else.
	handover
)

func (s standing) String() string {
	return [...]string{"other", "ours", "stale", "other-pod", "unassigned", "handover"}[s]
}

// self is who this process is, as the protocol needs it.
type self struct {
	identity    string
	incarnation string
	podUID      string
}

// standingOf reads lease (nil: none) for this process: the same rules as the Rust agent's.
func standingOf(l *coordinationv1.Lease, me self) standing {
	if l == nil || holder(l) != me.identity {
		return other
	}
	inc := l.Annotations[incarnationAnnotation]
	switch {
	case inc != "" && inc != me.incarnation:
		return stale
	case inc == me.incarnation:
		// Taken by this process already: its term, whatever marks were edited since.
	case !assignedByArbiter(l):
		return unassigned
	default:
		if uid := l.Annotations[holderPodAnnotation]; uid != "" && uid != me.podUID {
			return otherPod
		}
	}
	if p := preferredHolder(l); p != "" && p != me.identity {
		return handover
	}
	return ours
}

// holder is the Lease's holder ("" when unset or released).
func holder(l *coordinationv1.Lease) string {
	if l == nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// term is the Lease's term, the fencing token: leaseTransitions.
func term(l *coordinationv1.Lease) int32 {
	if l == nil || l.Spec.LeaseTransitions == nil {
		return 0
	}
	return *l.Spec.LeaseTransitions
}

// preferredHolder reads the field or, since the API server drops it unless the
// CoordinatedLeaderElection gate is on, the annotation.
func preferredHolder(l *coordinationv1.Lease) string {
	if l.Spec.PreferredHolder != nil && *l.Spec.PreferredHolder != "" {
		return *l.Spec.PreferredHolder
	}
	return l.Annotations[preferredHolderAnnotation]
}

// assignedByArbiter: the Lease carries arbiter's label and the assignment mark for its holder
// and term.
func assignedByArbiter(l *coordinationv1.Lease) bool {
	h := holder(l)
	return h != "" && l.Labels[ManagedLabel] == "true" &&
		l.Annotations[assignedAnnotation] == fmt.Sprintf("%s/%d", h, term(l))
}

// takenIn is the value of the taken-in-pod mark: the pod this process took its term in.
func takenIn(incarnation, podUID string) string {
	return incarnation + ":" + podUID
}

// renewedAfter is a renewal's renewTime: now, or a microsecond after previous when the wall
// clock does not read later (a renewal that wrote the same time again would not change the
// record, and the arbiter counts a renewal by the record changing).
func renewedAfter(previous *metav1.MicroTime, now time.Time) metav1.MicroTime {
	now = now.Truncate(time.Microsecond)
	if previous != nil && !previous.Time.Before(now) {
		return metav1.NewMicroTime(previous.Time.Truncate(time.Microsecond).Add(time.Microsecond))
	}
	return metav1.NewMicroTime(now)
}

// renew marks lease (a copy) renewed by this process: renewTime, its lease duration, its
// incarnation and the pod it runs in.
func renew(l *coordinationv1.Lease, me self, leaseDuration time.Duration, now time.Time) {
	rt := renewedAfter(l.Spec.RenewTime, now)
	l.Spec.RenewTime = &rt
	secs := int32(leaseDuration / time.Second)
	l.Spec.LeaseDurationSeconds = &secs
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[incarnationAnnotation] = me.incarnation
	if me.podUID != "" {
		l.Annotations[takenInPodAnnotation] = takenIn(me.incarnation, me.podUID)
	} else {
		delete(l.Annotations, takenInPodAnnotation)
	}
	// Sent back, a stale copy's managed fields would replace the live ones; without them the
	// API server keeps its own.
	l.ManagedFields = nil
}

// release marks lease (a copy) released by this process: no holder, a fresh renewTime, and who
// stepped down.
func release(l *coordinationv1.Lease, me self, now time.Time) {
	empty := ""
	l.Spec.HolderIdentity = &empty
	rt := metav1.NewMicroTime(now.Truncate(time.Microsecond))
	l.Spec.RenewTime = &rt
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[releasedByAnnotation] = me.identity
	l.ManagedFields = nil
}

// mayRelease: the Lease names this identity and no other process's incarnation.
func mayRelease(l *coordinationv1.Lease, me self) bool {
	if holder(l) != me.identity {
		return false
	}
	inc := l.Annotations[incarnationAnnotation]
	return inc == "" || inc == me.incarnation
}

// terminationMessage is what this process writes to its container's termination log: once the
// container ends, the kubelet reports it, and the arbiter takes it as proof that the process
// that took the term is gone.
func terminationMessage(incarnation string) string {
	return "arbiter incarnation " + incarnation
}

// validIdentity: a LeaseCandidate name (a DNS subdomain), which is what a holder identity is.
func validIdentity(s string) bool {
	if s == "" || len(s) > 253 || strings.Trim(s, "abcdefghijklmnopqrstuvwxyz0123456789-.") != "" {
		return false
	}
	edge := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }
	return edge(s[0]) && edge(s[len(s)-1])
}
