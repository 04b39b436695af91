package arbiterlock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/klog/v2"

	"github.com/go-logr/logr"
)

// CandidateResource is arbiter's LeaseCandidate API.
var CandidateResource = schema.GroupVersionResource{Group: "arbiter.dev", Version: "v1alpha1", Resource: "leasecandidates"}

// The candidate's refresh cadence: the Rust agent's (crates/candidate/src/registration.rs).
const (
	// refresh: how often the candidate writes renewTime on its own (a sign of life between
	// elections; every ping is answered at once).
	refresh = 5 * time.Minute
	// refreshContested: while another process's incarnation is on the candidate (two
	// processes sharing one identity, which the arbiter reports).
	refreshContested = 30 * time.Second
	// refreshOnNewOther: how soon after first seeing a given other process's incarnation.
	refreshOnNewOther = 2 * time.Second
	// othersKept: how many other incarnations are remembered.
	othersKept = 16
	// readEvery: how often the candidate is also read, in case its watch hangs.
	readEvery = 30 * time.Second
	// forbiddenForAtMost: how long a registration refused for want of rights is retried (the
	// RoleBinding may come with the pod).
	forbiddenForAtMost = 30 * time.Second
)

// candidates writes this replica's LeaseCandidate.
type candidates struct {
	api  dynamic.ResourceInterface
	opts Options
	me   self
}

func newCandidates(dyn dynamic.Interface, opts Options, me self) *candidates {
	return &candidates{api: dyn.Resource(CandidateResource).Namespace(opts.Namespace), opts: opts, me: me}
}

// register creates the candidate or updates the one an earlier process of this identity left,
// retrying while the API server is unreachable (and for a while when forbidden). It returns
// the ping the registration's write answered.
func (c *candidates) register(ctx context.Context) (*time.Time, error) {
	started := time.Now()
	backoff := wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 1, Steps: 1 << 30, Cap: 2 * time.Second}
	for attempt := 1; ; attempt++ {
		ping, err := c.tryRegister(ctx)
		if err == nil {
			return ping, nil
		}
		forbidden := apierrors.IsForbidden(err)
		if !(transient(err) || forbidden && time.Since(started) < forbiddenForAtMost) {
			return nil, err
		}
		klog.FromContext(ctx).Info("cannot register the candidate yet; retrying", "attempt", attempt, "forbidden", forbidden, "err", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(backoff.Step()):
		}
	}
}

// transient: the API server did not answer, or answered "not now".
func transient(err error) bool {
	var s apierrors.APIStatus
	if !errors.As(err, &s) {
		return true
	}
	code := s.Status().Code
	return code >= 500 || code == 429
}

func (c *candidates) tryRegister(ctx context.Context) (*time.Time, error) {
	o := c.opts
	declared := strconv.Itoa(int(o.LeaseDuration / time.Second))
	for range 2 {
		renewTime := metav1.NewMicroTime(time.Now())
		existing, err := c.api.Get(ctx, o.Identity, metav1.GetOptions{})
		var written *unstructured.Unstructured
		switch {
		case apierrors.IsNotFound(err) && isCRDMissing(err):
			return nil, fmt.Errorf("the LeaseCandidate API (arbiter.dev/v1alpha1) is not served: is arbiter's CRD installed? (%w)", err)
		case apierrors.IsNotFound(err):
			written, err = c.create(ctx, renewTime, declared)
			if apierrors.IsAlreadyExists(err) {
				continue
			}
			if apierrors.IsInvalid(err) {
				return nil, fmt.Errorf("the API server refused the candidate: %w", err)
			}
		case err != nil:
			return nil, fmt.Errorf("reading LeaseCandidate %s/%s: %w", o.Namespace, o.Identity, err)
		default:
			if lease, _, _ := unstructured.NestedString(existing.Object, "spec", "leaseName"); lease != o.LeaseName {
				return nil, fmt.Errorf("LeaseCandidate %s/%s already exists for lease %q, and leaseName is immutable: delete it, or run with another identity", o.Namespace, o.Identity, lease)
			}
			written, err = c.update(ctx, existing, renewTime, declared)
		}
		if err != nil {
			return nil, err
		}
		klog.FromContext(ctx).Info("registered as a candidate", "candidate", o.Identity, "lease", o.LeaseName)
		return pingOf(written), nil
	}
	return nil, fmt.Errorf("LeaseCandidate %s/%s keeps changing under us", o.Namespace, o.Identity)
}

// isCRDMissing: a 404 for the resource itself, not for the object.
func isCRDMissing(err error) bool {
	var s apierrors.APIStatus
	if !errors.As(err, &s) {
		return false
	}
	d := s.Status().Details
	return d == nil || d.Name == ""
}

func (c *candidates) create(ctx context.Context, renewTime metav1.MicroTime, declared string) (*unstructured.Unstructured, error) {
	o := c.opts
	spec := map[string]any{
		"leaseName":     o.LeaseName,
		"binaryVersion": o.BinaryVersion,
		"strategy":      o.Strategy,
		"renewTime":     micro(renewTime),
	}
	if o.EmulationVersion != "" {
		spec["emulationVersion"] = o.EmulationVersion
	}
	meta := map[string]any{
		"name":      o.Identity,
		"namespace": o.Namespace,
		"annotations": map[string]any{
			incarnationAnnotation:   c.me.incarnation,
			leaseDurationAnnotation: declared,
		},
	}
	if owners := c.owners(); owners != nil {
		meta["ownerReferences"] = owners
	}
	if o.Instance != "" {
		meta["labels"] = map[string]any{InstanceLabel: o.Instance}
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "arbiter.dev/v1alpha1", "kind": "LeaseCandidate", "metadata": meta, "spec": spec,
	}}
	return c.api.Create(ctx, obj, metav1.CreateOptions{})
}

// update takes over a candidate an earlier process of this identity left: this incarnation,
// no overrun or withdrawal of the earlier one, this process's versions and pod.
func (c *candidates) update(ctx context.Context, existing *unstructured.Unstructured, renewTime metav1.MicroTime, declared string) (*unstructured.Unstructured, error) {
	o := c.opts
	var emulation any
	if o.EmulationVersion != "" {
		emulation = o.EmulationVersion
	}
	patch := map[string]any{
		"metadata": map[string]any{
			"annotations": map[string]any{
				incarnationAnnotation:   c.me.incarnation,
				overranAnnotation:       nil,
				withdrawnAnnotation:     nil,
				leaseDurationAnnotation: declared,
			},
		},
		"spec": map[string]any{
			"binaryVersion":    o.BinaryVersion,
			"emulationVersion": emulation,
			"strategy":         o.Strategy,
			"renewTime":        micro(renewTime),
		},
	}
	meta := patch["metadata"].(map[string]any)
	// A process outside a pod drops a pod an earlier one left as owner (the arbiter would take
	// that pod's stop for this process's); owners of other kinds stay.
	if owners := c.owners(); owners != nil {
		meta["ownerReferences"] = owners
	} else if refs := existing.GetOwnerReferences(); hasPod(refs) {
		kept := []any{}
		for _, r := range refs {
			if r.Kind != "Pod" {
				kept = append(kept, r)
			}
		}
		meta["ownerReferences"] = kept
	}
	if o.Instance != "" {
		meta["labels"] = map[string]any{InstanceLabel: o.Instance}
	} else {
		meta["labels"] = map[string]any{InstanceLabel: nil}
	}
	body, err := json.Marshal(patch)
	if err != nil {
		return nil, err
	}
	return c.api.Patch(ctx, o.Identity, types.MergePatchType, body, metav1.PatchOptions{})
}

func hasPod(refs []metav1.OwnerReference) bool {
	for _, r := range refs {
		if r.Kind == "Pod" {
			return true
		}
	}
	return false
}

// owners: the pod this replica runs in, when known.
func (c *candidates) owners() []any {
	if c.opts.PodName == "" || c.opts.PodUID == "" {
		return nil
	}
	return []any{map[string]any{"apiVersion": "v1", "kind": "Pod", "name": c.opts.PodName, "uid": c.opts.PodUID}}
}

// stamp writes renewTime (a ping's answer, or a refresh) with this process's incarnation.
func (c *candidates) stamp(ctx context.Context, renew time.Time) error {
	patch := map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{incarnationAnnotation: c.me.incarnation}},
		"spec":     map[string]any{"renewTime": micro(metav1.NewMicroTime(renew))},
	}
	body, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	_, err = c.api.Patch(ctx, c.opts.Identity, types.MergePatchType, body, metav1.PatchOptions{})
	return err
}

// withdraw deletes the candidate, or with keep, marks it withdrawn by this process (written as
// arbiter's field manager: the operator counts only such a mark; it never ends a term).
func (c *candidates) withdraw(ctx context.Context, keep bool) error {
	if !keep {
		err := c.api.Delete(ctx, c.opts.Identity, metav1.DeleteOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{withdrawnAnnotation: c.me.incarnation}}})
	_, err := c.api.Patch(ctx, c.opts.Identity, types.MergePatchType, body, metav1.PatchOptions{FieldManager: FieldManager})
	return err
}

// keepFresh answers pings and refreshes renewTime until ctx ends; it returns the error that
// stopped it (the candidate was deleted, or its watch could not be kept).
func (c *candidates) keepFresh(ctx context.Context, answered *time.Time) error {
	log := klog.FromContext(ctx).WithValues("candidate", c.opts.Identity)
	f := newFreshness(c.me.incarnation, time.Now(), answered)
	seen := make(chan *unstructured.Unstructured, 16)
	watchErr := make(chan error, 1)
	go c.follow(ctx, seen, watchErr)
	read := time.NewTicker(readEvery)
	defer read.Stop()
	// The read in flight, if any: it runs beside the watch, so that a read that hangs (up to
	// readEvery) holds up no answer to a ping the watch delivers meanwhile.
	reads := make(chan *unstructured.Unstructured, 1)
	reading := false
	backoff := retryBackoff()
	for {
		var renew time.Time
		var obj *unstructured.Unstructured
		timer := time.NewTimer(time.Until(f.next))
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case err := <-watchErr:
			timer.Stop()
			return err
		case obj = <-seen:
		case obj = <-reads:
			reading = false
		case <-read.C:
			if !reading {
				reading = true
				go c.read(ctx, reads, log)
			}
		case <-timer.C:
			renew = f.takePending(time.Now())
		}
		timer.Stop()
		if obj == nil && renew.IsZero() {
			continue
		}
		if obj != nil {
			r, ok := f.seen(candidateView(obj), time.Now(), time.Now())
			if !ok {
				continue
			}
			renew = r
		}
		err := c.stamp(ctx, renew)
		switch {
		case err == nil:
			backoff = retryBackoff()
			f.written(time.Now())
		case apierrors.IsNotFound(err):
			return fmt.Errorf("LeaseCandidate %s was deleted", c.opts.Identity)
		default:
			wait := backoff.Step()
			log.Info("writing the candidate failed (retrying)", "err", err, "retryIn", wait)
			f.failed(renew, time.Now(), wait)
		}
	}
}

// read reads the candidate from the API server's cache, bounded by readEvery; it delivers
// nil when the read failed.
func (c *candidates) read(ctx context.Context, out chan<- *unstructured.Unstructured, log logr.Logger) {
	rctx, cancel := context.WithTimeout(ctx, readEvery)
	defer cancel()
	obj, err := c.api.Get(rctx, c.opts.Identity, metav1.GetOptions{ResourceVersion: "0"})
	if err != nil {
		log.V(2).Info("reading the candidate failed", "err", err)
		obj = nil
	}
	out <- obj
}

// follow watches the candidate, re-establishing the watch when it ends (at most every half
// second).
func (c *candidates) follow(ctx context.Context, seen chan<- *unstructured.Unstructured, failed chan<- error) {
	sel := "metadata.name=" + c.opts.Identity
	backoff := wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 1, Steps: 1 << 30, Cap: 2 * time.Second}
	for ctx.Err() == nil {
		w, err := c.api.Watch(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			klog.FromContext(ctx).V(2).Info("candidate watch failed (retrying)", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(backoff.Step()):
			}
			continue
		}
		began := time.Now()
		for ev := range w.ResultChan() {
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue
			}
			if obj, ok := ev.Object.(*unstructured.Unstructured); ok {
				select {
				case seen <- obj:
				case <-ctx.Done():
				}
			}
		}
		w.Stop()
		select {
		case <-ctx.Done():
		case <-time.After(500*time.Millisecond - time.Since(began)):
		}
	}
}

func retryBackoff() *wait.Backoff {
	return &wait.Backoff{Duration: 2 * time.Second, Factor: 2, Jitter: 1, Steps: 1 << 30, Cap: 30 * time.Second}
}

// micro renders a MicroTime as the API server keeps it.
func micro(t metav1.MicroTime) string {
	return t.UTC().Format(metav1.RFC3339Micro)
}

// candidateSeen is what the freshness rules read from a candidate.
type candidateSeen struct {
	incarnation string
	ping, renew *time.Time
}

func candidateView(obj *unstructured.Unstructured) candidateSeen {
	at := func(field string) *time.Time {
		s, _, _ := unstructured.NestedString(obj.Object, "spec", field)
		if s == "" {
			return nil
		}
		var t metav1.MicroTime
		if err := t.UnmarshalQueryParameter(s); err != nil {
			return nil
		}
		tt := t.Time
		return &tt
	}
	return candidateSeen{incarnation: obj.GetAnnotations()[incarnationAnnotation], ping: at("pingTime"), renew: at("renewTime")}
}

func pingOf(obj *unstructured.Unstructured) *time.Time {
	return candidateView(obj).ping
}
