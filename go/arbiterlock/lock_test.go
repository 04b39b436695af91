package arbiterlock

// Request shapes only, against fake clients: what the lock writes and refuses. Behaviour is
// proven against the real operator and control plane (e2e/tests/go_controllers.rs).

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

func newTestLock(t *testing.T, leases ...runtime.Object) (*Lock, *fake.Clientset, *dynamicfake.FakeDynamicClient) {
	t.Helper()
	return newTestLockWith(t, Options{}, leases...)
}

func newTestLockWith(t *testing.T, o Options, leases ...runtime.Object) (*Lock, *fake.Clientset, *dynamicfake.FakeDynamicClient) {
	t.Helper()
	o.LeaseName, o.Namespace, o.Identity, o.BinaryVersion, o.TerminationLog = "l", "ns", "me", "1.31.0", "-"
	kube := fake.NewClientset(leases...)
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{CandidateResource: "LeaseCandidateList"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := NewWithClients(ctx, kube, dyn, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.stop() })
	return l, kube, dyn
}

// seen waits until the lock's watch shows lease's resourceVersion.
func seen(t *testing.T, l *Lock, rv string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		l.mu.Lock()
		got := l.lease != nil && l.lease.ResourceVersion == rv
		l.mu.Unlock()
		if got {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("the watch never showed resourceVersion %s", rv)
}

func record(l *Lock) resourcelock.LeaderElectionRecord {
	return resourcelock.LeaderElectionRecord{HolderIdentity: "me", LeaseDurationSeconds: int(l.opts.LeaseDuration / time.Second)}
}

func TestRegistrationCreatesTheCandidateWithThisProcess(t *testing.T) {
	_, _, dyn := newTestLock(t)
	c, err := dyn.Resource(CandidateResource).Namespace("ns").Get(context.Background(), "me", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	spec := c.Object["spec"].(map[string]any)
	if spec["leaseName"] != "l" || spec["binaryVersion"] != "1.31.0" || spec["emulationVersion"] != "1.31.0" || spec["strategy"] != OldestEmulationVersion || spec["renewTime"] == nil {
		t.Errorf("spec: %v", spec)
	}
	if a := c.GetAnnotations(); a[incarnationAnnotation] == "" || a[leaseDurationAnnotation] != "15" {
		t.Errorf("annotations: %v", a)
	}
}

func TestTheElectorWaitsForAnAssignmentAndIsNeverShownAnExpiredLease(t *testing.T) {
	held := lease("you", 4, true, "you/4", "")
	held.ResourceVersion = "1"
	long := metav1.NewMicroTime(time.Now().Add(-time.Hour))
	held.Spec.RenewTime = &long
	l, kube, _ := newTestLock(t, held)
	seen(t, l, "1")
	// Before it first leads, Get returns only with an assignment.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if rec, _, err := l.Get(ctx); err == nil {
		t.Fatalf("returned %+v with nothing assigned", rec)
	}
	got := make(chan *resourcelock.LeaderElectionRecord, 1)
	go func() {
		rec, _, _ := l.Get(context.Background())
		got <- rec
	}()
	edit(t, l, kube, "2", func(x *coordinationv1.Lease) {
		x.Spec.HolderIdentity, x.Spec.LeaseTransitions = ptr("me"), ptr(int32(5))
		x.Annotations[assignedAnnotation] = "me/5"
	})
	select {
	case rec := <-got:
		if rec == nil || rec.HolderIdentity != "me" || rec.LeaderTransitions != 5 {
			t.Fatalf("shown %+v", rec)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("an assignment did not reach the waiting Get")
	}
	// After a term (no more waiting), someone else's Lease is shown renewed now, whatever its
	// renewTime says: the elector never finds it expired.
	edit(t, l, kube, "3", func(x *coordinationv1.Lease) { x.Spec.HolderIdentity, x.Spec.RenewTime = ptr("you"), &long })
	l.mu.Lock()
	l.hasEnded = true
	l.mu.Unlock()
	rec, raw, err := l.Get(context.Background())
	if err != nil || rec.HolderIdentity != "you" || time.Since(rec.RenewTime.Time) > time.Second || len(raw) == 0 {
		t.Fatalf("%+v %v", rec, err)
	}
	if err := l.Create(context.Background(), record(l)); err == nil {
		t.Error("Create is refused: the arbiter creates Leases")
	}
}

func TestAnAssignedTermIsTakenWithAnUpdateThatWritesOnlyRenewalMarks(t *testing.T) {
	assigned := lease("me", 7, true, "me/7", "")
	assigned.ResourceVersion = "1"
	l, kube, _ := newTestLock(t, assigned)
	seen(t, l, "1")
	rec, _, err := l.Get(context.Background())
	if err != nil || rec.HolderIdentity != "me" {
		t.Fatalf("assigned: the elector is shown this replica: %+v %v", rec, err)
	}
	kube.ClearActions()
	r := record(l)
	r.LeaderTransitions = 99 // the elector's count is not the term
	if err := l.Update(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	var update k8stesting.UpdateActionImpl
	for _, a := range kube.Actions() {
		if u, ok := a.(k8stesting.UpdateActionImpl); ok {
			update = u
		}
	}
	if update.UpdateOptions.FieldManager != FieldManager {
		t.Errorf("written as field manager %q", update.UpdateOptions.FieldManager)
	}
	w := update.Object.(*coordinationv1.Lease)
	if holder(w) != "me" || term(w) != 7 || w.ResourceVersion != "1" || w.Annotations[incarnationAnnotation] != l.Incarnation() {
		t.Errorf("the write: holder %q term %d rv %q (a compare-and-swap on what was read) marks %v", holder(w), term(w), w.ResourceVersion, w.Annotations)
	}
	if got, err := l.Term(context.Background()); err != nil || got != 7 {
		t.Errorf("Term: %d %v", got, err)
	}
}

func TestALeaseTheArbiterDidNotAssignIsNeverTaken(t *testing.T) {
	handMade := lease("me", 1, false, "", "")
	handMade.ResourceVersion = "1"
	l, kube, _ := newTestLock(t, handMade)
	seen(t, l, "1")
	// Nothing to show: it names this replica, but the arbiter did not assign it.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if rec, _, err := l.Get(ctx); err == nil {
		t.Fatalf("shown %+v, want a wait for the arbiter", rec)
	}
	kube.ClearActions()
	err := l.Update(context.Background(), record(l))
	if err == nil || !strings.Contains(err.Error(), "does not name this replica") {
		t.Errorf("got %v", err)
	}
	for _, a := range kube.Actions() {
		if a.GetVerb() == "update" {
			t.Errorf("wrote %v", a)
		}
	}
}

func TestTheElectorsReleaseIsNotWrittenAndAMismatchedElectorIsRefused(t *testing.T) {
	assigned := lease("me", 2, true, "me/2", "")
	assigned.ResourceVersion = "1"
	l, kube, _ := newTestLock(t, assigned)
	seen(t, l, "1")
	kube.ClearActions()
	if err := l.Update(context.Background(), resourcelock.LeaderElectionRecord{LeaseDurationSeconds: 1}); err != nil {
		t.Fatal(err)
	}
	if len(kube.Actions()) != 0 {
		t.Errorf("the elector's release wrote %v", kube.Actions())
	}
	r := record(l)
	r.LeaseDurationSeconds = 60
	if err := l.Update(context.Background(), r); err == nil || !strings.Contains(err.Error(), "lease duration") {
		t.Errorf("an elector with other timings: %v", err)
	}
}

func TestAHandoverEndsTheTermOrAsksTheProgramToStop(t *testing.T) {
	for _, wired := range []bool{false, true} {
		assigned := lease("me", 5, true, "me/5", "")
		assigned.ResourceVersion = "1"
		l, kube, _ := newTestLock(t, assigned)
		seen(t, l, "1")
		stop := context.Background()
		if wired {
			stop = l.StepDownContext(context.Background())
		}
		if err := l.Update(context.Background(), record(l)); err != nil {
			t.Fatal(err)
		}
		live, _ := kube.CoordinationV1().Leases("ns").Get(context.Background(), "l", metav1.GetOptions{})
		live.Annotations[preferredHolderAnnotation] = "you"
		live.ResourceVersion = "3"
		if _, err := kube.CoordinationV1().Leases("ns").Update(context.Background(), live, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		seen(t, l, "3")
		err := l.Update(context.Background(), record(l))
		if wired {
			if err != nil || stop.Err() == nil {
				t.Errorf("wired: renewed while the program stops (%v), and told to stop (%v)", err, stop.Err())
			}
			continue
		}
		if err == nil {
			t.Error("not wired: the term ends at the request")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		if _, err := l.Term(ctx); err == nil {
			t.Error("not wired: no term after a handover")
		}
		cancel()
	}
}

// The fake clients do not stream a list's end (a bookmark): informers list the old way.
func TestMain(m *testing.M) {
	os.Setenv("KUBE_FEATURE_WatchListClient", "false")
	os.Exit(m.Run())
}

// edit replaces the Lease as a hand edit would (and waits for the lock's watch to show it).
func edit(t *testing.T, l *Lock, kube *fake.Clientset, rv string, change func(*coordinationv1.Lease)) {
	t.Helper()
	live, err := kube.CoordinationV1().Leases("ns").Get(context.Background(), "l", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	change(live)
	live.ResourceVersion = rv
	if _, err := kube.CoordinationV1().Leases("ns").Update(context.Background(), live, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	seen(t, l, rv)
}

// writes: the Lease updates the lock sent.
func writes(kube *fake.Clientset) []*coordinationv1.Lease {
	var out []*coordinationv1.Lease
	for _, a := range kube.Actions() {
		if u, ok := a.(k8stesting.UpdateActionImpl); ok && u.GetResource().Resource == "leases" {
			out = append(out, u.Object.(*coordinationv1.Lease))
		}
	}
	return out
}

// takeTerm: the lock takes the term the Lease assigns.
func takeTerm(t *testing.T, l *Lock) {
	t.Helper()
	if err := l.Update(context.Background(), record(l)); err != nil {
		t.Fatal(err)
	}
}

func TestATermEditedInUnderThisProcesssIncarnationIsNeverTaken(t *testing.T) {
	assigned := lease("me", 3, true, "me/3", "")
	assigned.ResourceVersion = "1"
	l, kube, _ := newTestLock(t, assigned)
	seen(t, l, "1")
	takeTerm(t, l)
	// The lease goes to someone else (the term ends), then a hand edit names this process
	// again at a term the arbiter never assigned, keeping its incarnation, label and mark gone.
	edit(t, l, kube, "5", func(x *coordinationv1.Lease) { x.Spec.HolderIdentity = ptr("you") })
	edit(t, l, kube, "6", func(x *coordinationv1.Lease) {
		x.Spec.HolderIdentity, x.Spec.LeaseTransitions = ptr("me"), ptr(int32(900))
		delete(x.Labels, ManagedLabel)
		delete(x.Annotations, assignedAnnotation)
	})
	kube.ClearActions()
	if err := l.Update(context.Background(), record(l)); err == nil {
		t.Fatal("took a term the arbiter never assigned")
	}
	if w := writes(kube); len(w) != 0 {
		t.Errorf("wrote %v", w)
	}
	if _, err := l.Term(quick()); err == nil {
		t.Error("a term after the edit")
	}
}

func TestATermThisProcessLedIsNeverReleasedUnderItsWork(t *testing.T) {
	assigned := lease("me", 5, true, "me/5", "")
	assigned.ResourceVersion = "1"
	l, kube, _ := newTestLock(t, assigned)
	seen(t, l, "1")
	takeTerm(t, l)
	// A handover request; the program does not watch StepDownContext: the term ends, but the
	// elector may still lead for its renew deadline, so nothing may release the lease.
	edit(t, l, kube, "3", func(x *coordinationv1.Lease) { x.Annotations[preferredHolderAnnotation] = "you" })
	kube.ClearActions()
	if err := l.Update(context.Background(), record(l)); err == nil {
		t.Error("renewed after the handover request")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, _, _ = l.Get(ctx)
	if _, err := l.Shutdown(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	for _, w := range writes(kube) {
		if holder(w) == "" {
			t.Errorf("released a term it led after the term ended: %+v", w.Annotations)
		}
	}
}

func TestShutdownReleasesOnlyATermThatStillCountsAndOnlyWhenTheWorkStopped(t *testing.T) {
	for _, workStopped := range []bool{true, false} {
		assigned := lease("me", 2, true, "me/2", "")
		assigned.ResourceVersion = "1"
		l, kube, dyn := newTestLock(t, assigned)
		seen(t, l, "1")
		takeTerm(t, l)
		kube.ClearActions()
		released, err := l.Shutdown(context.Background(), workStopped)
		if err != nil {
			t.Fatal(err)
		}
		w := writes(kube)
		if workStopped != released || workStopped != (len(w) == 1 && holder(w[0]) == "" && w[0].Annotations[releasedByAnnotation] == "me") {
			t.Errorf("work stopped %v: released %v, wrote %v", workStopped, released, w)
		}
		_, err = dyn.Resource(CandidateResource).Namespace("ns").Get(context.Background(), "me", metav1.GetOptions{})
		if workStopped == (err == nil) {
			t.Errorf("work stopped %v: the candidate withdrawn: %v", workStopped, err)
		}
	}
}

func TestAnEndedTermIsNotBroughtBackByARenewalInFlight(t *testing.T) {
	assigned := lease("me", 4, true, "me/4", "")
	assigned.ResourceVersion = "1"
	l, _, _ := newTestLock(t, assigned)
	seen(t, l, "1")
	takeTerm(t, l)
	l.endIfLeading("test")
	if l.renewed(klog.Background(), 4, boot()) {
		t.Fatal("an ended term counted again")
	}
}

func TestAnOverdueTermExitsTheProcessUnlessItsWorkStopped(t *testing.T) {
	exited := make(chan time.Duration, 1)
	exit = func(int) { exited <- boot() }
	defer func() { exit = os.Exit }()
	for _, stopped := range []bool{false, true} {
		assigned := lease("me", 1, true, "me/1", "")
		assigned.ResourceVersion = "1"
		o := Options{LeaseDuration: 4 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: time.Second}
		l, _, _ := newTestLockWith(t, o, assigned)
		l.SetExitAtTermEnd(true)
		seen(t, l, "1")
		takeTerm(t, l)
		l.mu.Lock()
		last := l.lastOK
		l.mu.Unlock()
		if stopped {
			if _, err := l.Shutdown(context.Background(), true); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case at := <-exited:
			if stopped {
				t.Fatal("exited after Shutdown said the work stopped")
			}
			if d := at - last; d < 3*time.Second || d >= 3500*time.Millisecond {
				t.Errorf("exited %v after the last renewal, want from 3 s (a second before the 4 s lease ends), before 3.5 s", d)
			}
		case <-time.After(5 * time.Second):
			if !stopped {
				t.Fatal("an overdue term did not exit")
			}
		}
	}
}

func ptr[T any](v T) *T { return &v }

func quick() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	_ = cancel
	return ctx
}

// controller-runtime's graceful stop returns nil at its deadline whatever still runs once its
// elector lost the lease: Shutdown's "work stopped" then no longer disarms the exit.
func TestShutdownAfterTheTermEndedKeepsTheExitArmed(t *testing.T) {
	exited := make(chan struct{}, 1)
	exit = func(int) { exited <- struct{}{} }
	defer func() { exit = os.Exit }()
	assigned := lease("me", 1, true, "me/1", "")
	assigned.ResourceVersion = "1"
	o := Options{LeaseDuration: 4 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: time.Second}
	l, kube, _ := newTestLockWith(t, o, assigned)
	l.SetExitAtTermEnd(true)
	seen(t, l, "1")
	takeTerm(t, l)
	// No renewal for the renew deadline: the term ends, then the program says its work stopped.
	time.Sleep(2500 * time.Millisecond)
	kube.ClearActions()
	released, err := l.Shutdown(context.Background(), true)
	if err != nil || released || len(writes(kube)) != 0 {
		t.Fatalf("released %v (%v), wrote %v", released, err, writes(kube))
	}
	select {
	case <-exited:
	case <-time.After(3 * time.Second):
		t.Fatal("the exit was disarmed by a word that came after the term ended")
	}
}

func TestAStoppingStandbyTakesNoTerm(t *testing.T) {
	assigned := lease("me", 1, true, "me/1", "")
	assigned.ResourceVersion = "1"
	l, kube, _ := newTestLock(t, assigned)
	seen(t, l, "1")
	ctx, cancel := context.WithCancel(context.Background())
	stop := l.StepDownContext(ctx)
	cancel() // SIGTERM: the program is stopping
	<-stop.Done()
	deadline := time.Now().Add(2 * time.Second)
	for {
		l.mu.Lock()
		stopping := l.stopping
		l.mu.Unlock()
		if stopping || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	kube.ClearActions()
	if err := l.Update(context.Background(), record(l)); err == nil {
		t.Fatal("took a term while stopping")
	}
	// It gives the assignment back, unled, so that the next holder need not wait for expiry.
	w := writes(kube)
	if len(w) != 1 || holder(w[0]) != "" || w[0].Annotations[incarnationAnnotation] != "" {
		t.Fatalf("wrote %v", w)
	}
}
