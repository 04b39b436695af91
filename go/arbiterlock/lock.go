package arbiterlock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// Nobody is what the elector is told holds the lease while the arbiter has named no one and it
// has seen no holder yet: a name no candidate can have (it has a '/'), so the elector waits
// instead of trying to take the lease.
const Nobody = "arbiter.dev/nobody"

// ErrNotLeading is returned by Term when ctx ends before this replica leads.
var ErrNotLeading = errors.New("arbiterlock: this replica does not lead")

// Lock is a client-go resourcelock.Interface under which client-go's LeaderElector leads only
// while the arbiter names this replica holder. See the package documentation.
type Lock struct {
	opts   Options
	me     self
	leases coordinationclient.LeaseInterface
	cands  *candidates
	stop   context.CancelFunc
	done   chan struct{}

	mu sync.Mutex
	// lease is the Lease as the watch last showed it (nil: none); synced once listed.
	lease  *coordinationv1.Lease
	synced bool
	// changed is closed, and replaced, on every change worth waking a waiter for.
	changed chan struct{}
	// The term this process leads, since when it counts as renewed (the last counted
	// renewal's send time, on the monotonic clock), and the last one it led (never taken again).
	leading  bool
	term     int32
	lastOK   time.Time
	ended    int32
	hasEnded bool
	// stepping: the arbiter asked for a handover while this replica leads, since stepSince.
	stepping  bool
	stepSince time.Time
	// stepDown: the contexts StepDownContext made (wired: the program watches one).
	stepDown []context.CancelFunc
	wired    bool
	failed   error
	// shown is the holder Get last showed the elector ("" before any).
	shown string
	// mismatch: the elector's lease duration differs from the lock's (reported once).
	mismatch bool
}

var _ resourcelock.Interface = (*Lock)(nil)

// New checks opts, registers this replica as a LeaseCandidate (retrying while the API server
// is unreachable, bounded by ctx), and starts following the Lease and answering the arbiter's
// pings until Shutdown.
func New(ctx context.Context, cfg *rest.Config, opts Options) (*Lock, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "arbiterlock"
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return NewWithClients(ctx, kube, dyn, opts)
}

// NewWithClients is New with clients of the caller's.
func NewWithClients(ctx context.Context, kube kubernetes.Interface, dyn dynamic.Interface, opts Options) (*Lock, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	me := self{identity: opts.Identity, incarnation: newIncarnation(), podUID: opts.PodUID}
	l := &Lock{
		opts:    opts,
		me:      me,
		leases:  kube.CoordinationV1().Leases(opts.Namespace),
		cands:   newCandidates(dyn, opts, me),
		changed: make(chan struct{}),
		done:    make(chan struct{}),
	}
	log := klog.FromContext(ctx).WithValues("lease", opts.LeaseName, "identity", opts.Identity)
	if opts.TerminationLog != "-" {
		recordIncarnation(log, opts.TerminationLog, me.incarnation)
	}
	answered, err := l.cands.register(ctx)
	if err != nil {
		return nil, fmt.Errorf("arbiterlock: registering the candidate: %w", err)
	}
	bg, stop := context.WithCancel(klog.NewContext(context.Background(), log))
	l.stop = stop
	informer := l.followLease(bg, kube)
	if err := l.waitSynced(ctx, informer); err != nil {
		stop()
		return nil, fmt.Errorf("arbiterlock: %w", err)
	}
	go func() {
		defer close(l.done)
		err := l.cands.keepFresh(bg, answered)
		if bg.Err() == nil {
			l.fail(err)
		}
	}()
	go l.watchdog(bg)
	return l, nil
}

func newIncarnation() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Identity is this replica's holder identity.
func (l *Lock) Identity() string { return l.opts.Identity }

// Describe names the lock.
func (l *Lock) Describe() string {
	return fmt.Sprintf("%s/%s (arbiter)", l.opts.Namespace, l.opts.LeaseName)
}

// Incarnation is this process's random id, stamped on its candidate and on the Lease it holds.
func (l *Lock) Incarnation() string { return l.me.incarnation }

// Options are the lock's options, defaults filled in.
func (l *Lock) Options() Options { return l.opts }

// RecordEvent passes the elector's events to Options.EventRecorder, on the Lease.
func (l *Lock) RecordEvent(s string) {
	if l.opts.EventRecorder == nil {
		return
	}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: l.opts.LeaseName, Namespace: l.opts.Namespace}}
	l.opts.EventRecorder.Eventf(lease, corev1.EventTypeNormal, "LeaderElection", "%v %v", l.opts.Identity, s)
}

// LeaderElectionConfig is a client-go elector configuration for this lock: its timings, its
// name, and callbacks. ReleaseOnCancel is off: the lock releases in Shutdown, once the program
// says its work stopped.
func (l *Lock) LeaderElectionConfig(callbacks leaderelection.LeaderCallbacks) leaderelection.LeaderElectionConfig {
	return leaderelection.LeaderElectionConfig{
		Lock:          l,
		LeaseDuration: l.opts.LeaseDuration,
		RenewDeadline: l.opts.RenewDeadline,
		RetryPeriod:   l.opts.RetryPeriod,
		Callbacks:     callbacks,
		Name:          l.opts.LeaseName,
	}
}

// Get is the elector's view of the Lease. It shows the Lease as it is only when the arbiter
// named this replica holder (then the elector goes on to Update, which takes or renews the term).
// Otherwise it shows the arbiter's holder (or Nobody) freshly renewed, so the elector's own expiry
// logic never tries to take a lease the arbiter did not assign. Before this process first leads,
// it waits until there is something new to show: an assignment reaches the elector at once,
// not a retry period later.
func (l *Lock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	for {
		l.mu.Lock()
		if l.failed != nil {
			err := l.failed
			l.mu.Unlock()
			return nil, nil, err
		}
		s := standingOf(l.lease, l.me)
		takeable := s == ours && !(l.hasEnded && term(l.lease) == l.ended)
		if takeable || l.leading && (s == ours || s == handover) {
			rec := recordOf(l.lease, l.opts)
			l.mu.Unlock()
			return marshal(rec)
		}
		if s == handover && !l.leading {
			// A fresh assignment the arbiter already wants moved on: give it back unled.
			l.mu.Unlock()
			klog.FromContext(ctx).Info("the lease names this replica but the arbiter wants another holder; releasing it")
			if _, err := l.releaseLive(ctx); err != nil {
				klog.FromContext(ctx).Info("releasing the lease failed", "err", err)
			}
			l.mu.Lock()
		}
		shown := holder(l.lease)
		if shown == l.me.identity {
			shown = ""
		}
		if shown == "" {
			shown = l.shown
		}
		mayWait := !l.hasEnded && !l.leading && l.synced
		if mayWait && shown == l.shown {
			ch := l.changed
			l.mu.Unlock()
			select {
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			case <-ch:
				continue
			}
		}
		if shown != "" {
			l.shown = shown
		} else {
			shown = Nobody
		}
		rec := shownRecord(l.lease, l.opts, shown)
		l.mu.Unlock()
		return marshal(rec)
	}
}

// Create is refused: the arbiter creates Leases. (The elector calls it only when Get says the
// Lease does not exist, which this Get never says.)
func (l *Lock) Create(ctx context.Context, _ resourcelock.LeaderElectionRecord) error {
	return fmt.Errorf("arbiterlock: the arbiter creates lease %s; this replica waits to be named", l.opts.LeaseName)
}

// Update takes or renews the term: a compare-and-swap on the Lease as read just before, written
// only while the arbiter names this process holder. It writes renewTime, the lease duration,
// this process's incarnation and pod; never the holder or the term (the arbiter's). The
// elector's release (holderIdentity "") is not written: Shutdown releases, once the program
// says its work stopped.
func (l *Lock) Update(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	log := klog.FromContext(ctx)
	if rec.HolderIdentity == "" {
		log.V(1).Info("not releasing on the elector's word: Shutdown releases once the work stopped")
		return nil
	}
	if rec.HolderIdentity != l.me.identity {
		return fmt.Errorf("arbiterlock: the elector wrote holder %q, not this replica", rec.HolderIdentity)
	}
	if err := l.mayRenew(log, rec); err != nil {
		return err
	}
	sent := time.Now()
	live, err := l.leases.Get(ctx, l.opts.LeaseName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		l.endIfLeading("the lease was deleted")
		return err
	}
	if err != nil {
		return err
	}
	if err := l.mayWrite(ctx, live); err != nil {
		return err
	}
	renewed := live.DeepCopy()
	renew(renewed, l.me, l.opts.LeaseDuration, time.Now())
	written, err := l.leases.Update(ctx, renewed, metav1.UpdateOptions{FieldManager: FieldManager})
	if err != nil {
		return err
	}
	if took := time.Since(sent); took > maxRenewLatency(l.opts) {
		return fmt.Errorf("arbiterlock: the renewal took %v, longer than %v: not counted", took, maxRenewLatency(l.opts))
	}
	l.renewed(log, term(written), sent)
	return nil
}

// mayRenew refuses a renewal the lock's own state rules out.
func (l *Lock) mayRenew(log klog.Logger, rec resourcelock.LeaderElectionRecord) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failed != nil {
		return l.failed
	}
	if want := int(l.opts.LeaseDuration / time.Second); rec.LeaseDurationSeconds != want {
		if !l.mismatch {
			l.mismatch = true
			log.Error(nil, "the elector's lease duration is not the lock's: refusing to lead (use Lock.LeaderElectionConfig or arbiterctrl.Options)", "elector", rec.LeaseDurationSeconds, "lock", want)
		}
		return fmt.Errorf("arbiterlock: the elector's lease duration (%ds) is not the lock's (%ds)", rec.LeaseDurationSeconds, want)
	}
	if l.leading && time.Since(l.lastOK) > l.opts.RenewDeadline {
		l.endTerm("no renewal for the renew deadline")
		return errors.New("arbiterlock: the term ended at the renew deadline")
	}
	if l.stepping && (!l.wired || time.Since(l.stepSince) > l.opts.StepDownGrace) {
		l.endTerm("handed over")
		return errors.New("arbiterlock: the arbiter asked for a handover")
	}
	return nil
}

// mayWrite checks the live Lease before a write: the arbiter names this process, for a term it
// has not led and ended.
func (l *Lock) mayWrite(ctx context.Context, live *coordinationv1.Lease) error {
	s := standingOf(live, l.me)
	l.mu.Lock()
	leading, current, stepping := l.leading, l.term, l.stepping
	ended := l.hasEnded && term(live) == l.ended
	l.mu.Unlock()
	switch {
	case leading && term(live) != current:
		l.endIfLeading("the term moved on")
	case s == ours && !ended:
		return nil
	case s == handover && leading && stepping:
		// Renewed while the program stops its work (StepDownGrace); mayRenew bounds it.
		return nil
	case s == handover && leading:
		// Seen here before the watch showed it: the same step-down.
		if l.stepDownNow() {
			return nil
		}
	case s == handover:
		if _, err := l.releaseLive(ctx); err != nil {
			klog.FromContext(ctx).Info("releasing the lease failed", "err", err)
		}
	default:
		l.endIfLeading("the lease names " + holder(live))
	}
	return fmt.Errorf("arbiterlock: the arbiter does not name this replica holder of %s (%s)", l.opts.LeaseName, s)
}

// renewed counts a renewal of term sent at sent.
func (l *Lock) renewed(log klog.Logger, t int32, sent time.Time) {
	l.mu.Lock()
	started := !l.leading
	l.leading, l.term, l.lastOK = true, t, sent
	if started {
		l.notify()
	}
	l.mu.Unlock()
	if started {
		log.Info("leading", "term", t)
		if l.opts.OnStartedTerm != nil {
			go l.opts.OnStartedTerm(t)
		}
	}
}

// Term is the term this replica leads at (the fencing token); while it leads none, Term waits
// for one until ctx ends (ErrNotLeading). A term counts until the lock ends it: the renew
// deadline after its last renewal, a handover (after StepDownGrace), another holder.
func (l *Lock) Term(ctx context.Context) (int32, error) {
	for {
		l.mu.Lock()
		if l.leading && time.Since(l.lastOK) < l.opts.RenewDeadline {
			t := l.term
			l.mu.Unlock()
			return t, nil
		}
		ch := l.changed
		l.mu.Unlock()
		select {
		case <-ctx.Done():
			return 0, ErrNotLeading
		case <-ch:
		case <-time.After(l.opts.RetryPeriod):
		}
	}
}

// StepDownContext is parent, also cancelled when this replica should stop: the arbiter asked
// it to hand over while it leads (the lock then keeps renewing for StepDownGrace while the
// program stops its work; call Shutdown(ctx, true) after), or the lock failed while it was a
// standby. Give it to the manager (mgr.Start) or to whatever runs the elector.
func (l *Lock) StepDownContext(parent context.Context) context.Context {
	ctx, cancel := context.WithCancel(parent)
	l.mu.Lock()
	l.wired = true
	l.stepDown = append(l.stepDown, cancel)
	now := l.stepping || l.failed != nil && !l.leading
	l.mu.Unlock()
	if now {
		cancel()
	}
	return ctx
}

// Err is why the lock stopped following the lease, if it did (the candidate was deleted, say):
// it then never leads again.
func (l *Lock) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.failed
}

// Shutdown leaves: it stops following, releases the lease if this process led and workStopped
// (so the next holder starts at once), and deletes the candidate. Call it after the work
// guarded by the lease has stopped: for controller-runtime, with workStopped = (mgr.Start
// returned nil). Without workStopped the lease is not released: the arbiter waits its
// expiry. Returns whether it released.
func (l *Lock) Shutdown(ctx context.Context, workStopped bool) (bool, error) {
	l.stop()
	<-l.done
	l.mu.Lock()
	led := l.leading || l.hasEnded
	l.endTerm("shut down")
	l.mu.Unlock()
	var errs []error
	released := false
	if led && workStopped {
		var err error
		released, err = l.releaseLive(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("releasing the lease (it will expire): %w", err))
		}
	}
	if err := l.cands.withdraw(ctx, false); err != nil {
		errs = append(errs, fmt.Errorf("withdrawing the candidate: %w", err))
	}
	return released, errors.Join(errs...)
}

// releaseLive gives the lease up (holder "") if it still names this process; a compare-and-swap
// on the Lease as read just before, retried when a renewal in flight won.
func (l *Lock) releaseLive(ctx context.Context) (bool, error) {
	for range 3 {
		live, err := l.leases.Get(ctx, l.opts.LeaseName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if !mayRelease(live, l.me) {
			return false, nil
		}
		released := live.DeepCopy()
		release(released, l.me, time.Now())
		_, err = l.leases.Update(ctx, released, metav1.UpdateOptions{FieldManager: FieldManager})
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return false, err
		}
		klog.FromContext(ctx).Info("released the lease", "lease", l.opts.LeaseName)
		return true, nil
	}
	return false, fmt.Errorf("releasing lease %s: it kept changing", l.opts.LeaseName)
}

// observe takes the Lease as the watch shows it (nil: deleted).
func (l *Lock) observe(lease *coordinationv1.Lease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lease = lease
	l.notify()
	if !l.leading {
		return
	}
	switch s := standingOf(lease, l.me); {
	case lease == nil:
		l.endTerm("the lease was deleted")
	case term(lease) != l.term:
		l.endTerm("the term moved on")
	case s == handover:
		l.stepDownLocked()
	case s != ours:
		l.endTerm("the lease names " + holder(lease))
	}
}

// stepDownNow steps down; true while renewals go on (the program watches StepDownContext).
func (l *Lock) stepDownNow() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stepDownLocked()
	return l.leading && l.stepping
}

// stepDownLocked: the arbiter asked this leader to hand over. A program that watches
// StepDownContext is told to stop, and renewals go on for StepDownGrace while it does;
// otherwise the term ends now (the elector then stops at its renew deadline).
func (l *Lock) stepDownLocked() {
	if l.stepping || !l.leading {
		return
	}
	l.stepping, l.stepSince = true, time.Now()
	l.cancelStepDown()
	if !l.wired {
		l.endTerm("handed over")
	}
}

func (l *Lock) cancelStepDown() {
	for _, cancel := range l.stepDown {
		cancel()
	}
}

func (l *Lock) endIfLeading(why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.endTerm(why)
}

// endTerm ends the term this process leads, if any (l.mu held).
func (l *Lock) endTerm(why string) {
	if !l.leading {
		return
	}
	t := l.term
	l.leading, l.stepping = false, false
	l.ended, l.hasEnded = t, true
	l.notify()
	klog.Background().Info("leadership ended", "lease", l.opts.LeaseName, "term", t, "reason", why)
	if l.opts.OnEndedTerm != nil {
		go l.opts.OnEndedTerm(t, why)
	}
}

// fail: a background task died; the lock never leads again. A standby is told to stop (its
// program may restart and register again); a leader's term ends, and the elector stops at its
// renew deadline (controller-runtime then exits at once, without its graceful shutdown).
func (l *Lock) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	klog.Background().Error(err, "the lock stopped following the lease", "lease", l.opts.LeaseName)
	l.failed = fmt.Errorf("arbiterlock: %w", err)
	if l.leading {
		l.endTerm("the lock failed")
	} else {
		l.cancelStepDown()
	}
	l.notify()
}

// watchdog ends the term at the renew deadline after its last renewal, even if the elector
// stops calling (Term and OnEndedTerm then say so at once).
func (l *Lock) watchdog(ctx context.Context) {
	tick := time.NewTicker(l.opts.RetryPeriod / 2)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			l.mu.Lock()
			if l.leading && time.Since(l.lastOK) > l.opts.RenewDeadline {
				l.endTerm("no renewal for the renew deadline")
			}
			l.mu.Unlock()
		}
	}
}

// notify wakes every waiter (l.mu held).
func (l *Lock) notify() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// recordOf is the Lease as it is, for the elector.
func recordOf(l *coordinationv1.Lease, o Options) resourcelock.LeaderElectionRecord {
	rec := shownRecord(l, o, holder(l))
	if l.Spec.RenewTime != nil {
		rec.RenewTime = metav1.NewTime(l.Spec.RenewTime.Time)
	}
	return rec
}

// shownRecord is the Lease as the elector is shown it: holder shown, renewed now.
func shownRecord(l *coordinationv1.Lease, o Options, shown string) resourcelock.LeaderElectionRecord {
	now := metav1.NewTime(time.Now())
	rec := resourcelock.LeaderElectionRecord{
		HolderIdentity:       shown,
		LeaseDurationSeconds: int(o.LeaseDuration / time.Second),
		AcquireTime:          now,
		RenewTime:            now,
	}
	if l != nil {
		rec.LeaderTransitions = int(term(l))
		if l.Spec.AcquireTime != nil {
			rec.AcquireTime = metav1.NewTime(l.Spec.AcquireTime.Time)
		}
	}
	return rec
}

func marshal(rec resourcelock.LeaderElectionRecord) (*resourcelock.LeaderElectionRecord, []byte, error) {
	raw, err := json.Marshal(rec)
	if err != nil {
		return nil, nil, err
	}
	return &rec, raw, nil
}
