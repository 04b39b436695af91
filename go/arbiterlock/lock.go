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

// errShutDown: the lock was shut down.
var errShutDown = errors.New("the lock was shut down")

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
	// The term this process leads, and when its last counted renewal was sent (boot clock).
	leading bool
	term    int32
	lastOK  time.Duration
	// The last term it led and ended (never taken again), and the last term it wrote.
	ended     int32
	hasEnded  bool
	wroteTerm int32
	wrote     bool
	// stepping: the arbiter asked for a handover while this replica leads, since stepSince.
	stepping  bool
	stepSince time.Duration
	// stopCtxs: the contexts StepDownContext made (wired: the program watches one).
	stopCtxs []context.CancelFunc
	wired    bool
	failed   error
	// shown is the holder Get last showed the elector ("" before any).
	shown string
	// mismatch: the elector's lease duration differs from the lock's (reported once).
	mismatch bool
	// exitAtTermEnd (SetExitAtTermEnd); exitArmed: a term ended and the process must be gone
	// by its deadline unless workStopped (Shutdown said so).
	exitAtTermEnd bool
	exitArmed     bool
	workStopped   bool
	// stopping: a StepDownContext is done (the program is stopping): no term is taken.
	stopping bool
	// callbacks: OnStartedTerm and OnEndedTerm calls, in order.
	callbacks *queue
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
		opts:      opts,
		me:        me,
		leases:    kube.CoordinationV1().Leases(opts.Namespace),
		cands:     newCandidates(dyn, opts, me),
		changed:   make(chan struct{}),
		done:      make(chan struct{}),
		callbacks: newQueue(),
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
	go l.callbacks.run()
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
// named this process holder (then the elector goes on to Update, which takes or renews the
// term). Otherwise it shows the arbiter's holder (or Nobody) freshly renewed, so the elector's
// own expiry logic never tries to take a lease the arbiter did not assign. Before this process
// first leads, it returns only once the arbiter assigns it the lease (or ctx ends): the
// assignment reaches the elector at once, not a retry period later, and the elector does not
// learn of other holders (OnNewLeader is not called for them). It never waits while this
// process leads or after: the elector's stop and its release path are never held up.
func (l *Lock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	for {
		l.mu.Lock()
		if l.failed != nil {
			err := l.failed
			l.mu.Unlock()
			return nil, nil, fmt.Errorf("arbiterlock: %w", err)
		}
		if l.takeable(l.lease) || l.leading && standingOf(l.lease, l.me) == handover {
			rec := recordOf(l.lease, l.opts)
			l.mu.Unlock()
			return marshal(rec)
		}
		if l.givesBack(l.lease) {
			l.mu.Unlock()
			l.giveBack(ctx)
			l.mu.Lock()
		}
		shown := holder(l.lease)
		if shown == l.me.identity || shown == "" {
			shown = l.shown
		}
		// Until this process first leads, Get returns only with an assignment: were it to return
		// with a new holder's name, the elector would sleep a retry period or more before it asked
		// again, and an assignment made meanwhile would wait for it.
		mayWait := !l.hasEnded && !l.leading && l.synced
		if mayWait {
			ch := l.changed
			// A give-back that failed is tried again a retry period later.
			var retry <-chan time.Time
			if l.givesBack(l.lease) {
				retry = time.After(l.opts.RetryPeriod)
			}
			l.mu.Unlock()
			select {
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			case <-ch:
			case <-retry:
			}
			continue
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

// giveBack releases a fresh assignment the arbiter already wants moved on, unled.
func (l *Lock) giveBack(ctx context.Context) {
	log := klog.FromContext(ctx)
	log.Info("the lease names this replica but the arbiter wants another holder; giving it back unled")
	if _, err := l.releaseLive(ctx, (*Lock).givesBack); err != nil {
		log.Info("giving the lease back failed", "err", err)
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
	sent := boot()
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
	// Before the write: a take whose answer is lost is retaken, at this term only.
	l.mu.Lock()
	l.wrote, l.wroteTerm = true, term(live)
	l.mu.Unlock()
	written, err := l.leases.Update(ctx, renewed, metav1.UpdateOptions{FieldManager: FieldManager})
	if err != nil {
		return err
	}
	if took := boot() - sent; took > maxRenewLatency(l.opts) {
		return fmt.Errorf("arbiterlock: the renewal took %v, longer than %v: not counted", took, maxRenewLatency(l.opts))
	}
	if !l.renewed(log, term(written), sent) {
		return errors.New("arbiterlock: the term ended while it was being renewed")
	}
	return nil
}

// mayRenew refuses a renewal the lock's own state rules out.
func (l *Lock) mayRenew(log klog.Logger, rec resourcelock.LeaderElectionRecord) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failed != nil {
		return fmt.Errorf("arbiterlock: %w", l.failed)
	}
	if want := int(l.opts.LeaseDuration / time.Second); rec.LeaseDurationSeconds != want {
		if !l.mismatch {
			l.mismatch = true
			log.Error(nil, "the elector's lease duration is not the lock's: refusing to lead (use Lock.LeaderElectionConfig or arbiterctrl.Options)", "elector", rec.LeaseDurationSeconds, "lock", want)
		}
		return fmt.Errorf("arbiterlock: the elector's lease duration (%ds) is not the lock's (%ds)", rec.LeaseDurationSeconds, want)
	}
	if l.leading && !l.counts() {
		l.endTerm("no renewal for the renew deadline")
	}
	if l.stepping && (!l.wired || boot()-l.stepSince > l.opts.StepDownGrace) {
		l.endTerm("handed over: the work did not stop within StepDownGrace")
	}
	if !l.leading && l.hasEnded && holder(l.lease) == l.me.identity && term(l.lease) == l.ended {
		return fmt.Errorf("arbiterlock: term %d ended", l.ended)
	}
	return nil
}

// mayWrite checks the live Lease before a write: the arbiter names this process, for a term it
// may take or renew.
func (l *Lock) mayWrite(ctx context.Context, live *coordinationv1.Lease) error {
	l.mu.Lock()
	s := standingOf(live, l.me)
	switch {
	case l.leading && term(live) != l.term:
		l.endTerm("the term moved on")
	case l.leading && s == handover:
		// Seen here before the watch showed it: the same step-down.
		l.stepDown()
		if l.leading && l.stepping {
			l.mu.Unlock()
			return nil // renewed while the program stops its work (StepDownGrace)
		}
	case l.takeable(live):
		l.mu.Unlock()
		return nil
	case l.givesBack(live):
		l.mu.Unlock()
		l.giveBack(ctx)
		l.mu.Lock()
	case l.leading:
		l.endTerm("the lease names " + holder(live))
	}
	l.mu.Unlock()
	return fmt.Errorf("arbiterlock: the arbiter does not name this replica holder of %s (%s)", l.opts.LeaseName, s)
}

// Err is why the lock stopped following the lease, if it did (the candidate was deleted, say):
// it then never leads again.
func (l *Lock) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.failed
}

// shutdownTimeout bounds each of Shutdown's requests (the process is on its way out).
const shutdownTimeout = 2 * time.Second

// Shutdown leaves. Call it once the program's work guarded by the lease has stopped, or is
// abandoned.
//
// With workStopped (for controller-runtime: mgr.Start returned nil), it releases the lease if
// this process still leads, so that the next holder starts at once, and deletes the candidate.
// Without, it neither releases nor (if this process led) withdraws: the work may still run, so
// the process should exit at once, and the arbiter waits for the lease to expire. Each request
// is bounded by 2 s. Returns whether it released.
func (l *Lock) Shutdown(ctx context.Context, workStopped bool) (bool, error) {
	l.mu.Lock()
	mayRelease := workStopped && l.counts()
	led := l.leading || l.hasEnded
	// The program's word that its work stopped counts only for a term that still counts: once a
	// term ended, the elector may have stopped leading without waiting for the work (controller-
	// runtime's graceful stop then returns nil at its deadline whatever still runs), and an
	// armed exit stays armed.
	if workStopped && (mayRelease || !led) {
		l.workStopped = true
	}
	// No renewal, and no Get, from now on; with ExitAtTermEnd and work that may still run, the
	// exit is armed.
	l.endTerm("shut down")
	l.failed = errShutDown
	l.notify()
	l.mu.Unlock()
	l.stop()
	<-l.done
	var errs []error
	released := false
	if mayRelease {
		rctx, cancel := context.WithTimeout(ctx, shutdownTimeout)
		var err error
		released, err = l.releaseLive(rctx, func(l *Lock, lease *coordinationv1.Lease) bool {
			return lease.Annotations[incarnationAnnotation] == l.me.incarnation
		})
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("releasing the lease (it will expire): %w", err))
		}
	}
	l.callbacks.close()
	if workStopped || !led {
		wctx, cancel := context.WithTimeout(ctx, shutdownTimeout)
		if err := l.cands.withdraw(wctx, false); err != nil {
			errs = append(errs, fmt.Errorf("withdrawing the candidate: %w", err))
		}
		cancel()
	}
	return released, errors.Join(errs...)
}

// releaseLive gives the lease up (holder "") if it still names this process and may(live)
// holds; a compare-and-swap on the Lease as read just before, retried when a renewal in flight
// won.
func (l *Lock) releaseLive(ctx context.Context, may func(*Lock, *coordinationv1.Lease) bool) (bool, error) {
	for range 3 {
		live, err := l.leases.Get(ctx, l.opts.LeaseName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		l.mu.Lock()
		ok := mayRelease(live, l.me) && may(l, live)
		l.mu.Unlock()
		if !ok {
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
		l.stepDown()
	case s != ours:
		l.endTerm("the lease names " + holder(lease))
	}
}

func (l *Lock) endIfLeading(why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.endTerm(why)
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
