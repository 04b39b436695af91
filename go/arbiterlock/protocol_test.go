package arbiterlock

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// lease is a Lease naming holder at term, labelled or not, with the assignment mark and an
// incarnation when given.
func lease(holderName string, t int32, labelled bool, mark, incarnation string) *coordinationv1.Lease {
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "l", Namespace: "ns", Annotations: map[string]string{}, Labels: map[string]string{}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holderName, LeaseTransitions: &t},
	}
	if labelled {
		l.Labels[ManagedLabel] = "true"
	}
	if mark != "" {
		l.Annotations[assignedAnnotation] = mark
	}
	if incarnation != "" {
		l.Annotations[incarnationAnnotation] = incarnation
	}
	return l
}

// The same cases as the Rust agent's (crates/candidate/src/leadership.rs): a term is taken only from
// the arbiter's assignment, never resumed from an earlier process, and taken only in the pod it
// was assigned in.
func TestATermIsTakenOnlyFromTheArbitersAssignment(t *testing.T) {
	me := self{identity: "me", incarnation: "inc"}
	inPod := func(uid string) self { s := me; s.podUID = uid; return s }
	withPod := func(l *coordinationv1.Lease, uid string) *coordinationv1.Lease {
		l.Annotations[holderPodAnnotation] = uid
		return l
	}
	withPreferred := func(l *coordinationv1.Lease, p string) *coordinationv1.Lease {
		l.Annotations[preferredHolderAnnotation] = p
		return l
	}
	cases := []struct {
		name  string
		lease *coordinationv1.Lease
		me    self
		want  standing
	}{
		{"a fresh assignment", lease("me", 3, true, "me/3", ""), me, ours},
		{"no lease", nil, me, other},
		{"a client-go Lease naming this identity", lease("me", 7, false, "", ""), me, unassigned},
		{"no label", lease("me", 3, false, "me/3", ""), me, unassigned},
		{"no mark", lease("me", 3, true, "", ""), me, unassigned},
		{"the term edited since the assignment", lease("me", 4, true, "me/3", ""), me, unassigned},
		{"taken by this process already, whatever was edited since", lease("me", 3, false, "", "inc"), me, ours},
		{"an earlier process's term", lease("me", 3, true, "me/3", "other"), me, stale},
		{"someone else's", lease("you", 3, true, "you/3", ""), me, other},
		{"released", lease("", 3, true, "", ""), me, other},
		{"assigned in another pod", withPod(lease("me", 3, true, "me/3", ""), "uid-old"), inPod("uid-new"), otherPod},
		{"a process that cannot say its pod", withPod(lease("me", 3, true, "me/3", ""), "uid-old"), me, otherPod},
		{"assigned in this pod", withPod(lease("me", 3, true, "me/3", ""), "uid-old"), inPod("uid-old"), ours},
		{"taken in this process, pod aside", withPod(lease("me", 3, true, "me/3", "inc"), "uid-old"), inPod("uid-new"), ours},
		{"a handover asked for", withPreferred(lease("me", 3, true, "me/3", "inc"), "you"), me, handover},
		{"preferred is this replica", withPreferred(lease("me", 3, true, "me/3", "inc"), "me"), me, ours},
	}
	for _, c := range cases {
		if got := standingOf(c.lease, c.me); got != c.want {
			t.Errorf("%s: got %s, want %s", c.name, got, c.want)
		}
	}
}

func TestARenewalAlwaysChangesRenewTimeWhateverTheWallClockReads(t *testing.T) {
	now := time.Now()
	ahead := metav1.NewMicroTime(now.Add(time.Hour).Truncate(time.Microsecond))
	if got := renewedAfter(&ahead, now); !got.Time.Equal(ahead.Add(time.Microsecond)) {
		t.Errorf("a clock behind the last renewal: got %v, want a microsecond after %v", got, ahead)
	}
	past := metav1.NewMicroTime(now.Add(-5 * time.Second))
	if got := renewedAfter(&past, now); !got.Time.Equal(now.Truncate(time.Microsecond)) {
		t.Errorf("otherwise now: got %v", got)
	}
}

func TestARenewalWritesItsMarksAndNeverTheHolderOrTheTerm(t *testing.T) {
	l := lease("me", 3, true, "me/3", "")
	l.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "arbiter"}}
	renew(l, self{identity: "me", incarnation: "inc", podUID: "uid"}, 15*time.Second, time.Now())
	if holder(l) != "me" || term(l) != 3 {
		t.Errorf("holder or term changed: %q %d", holder(l), term(l))
	}
	if l.Annotations[incarnationAnnotation] != "inc" || l.Annotations[takenInPodAnnotation] != "inc:uid" {
		t.Errorf("marks: %v", l.Annotations)
	}
	if *l.Spec.LeaseDurationSeconds != 15 || l.Spec.RenewTime == nil || l.ManagedFields != nil {
		t.Errorf("lease duration, renew time or managed fields: %+v", l)
	}
	renew(l, self{identity: "me", incarnation: "inc"}, 15*time.Second, time.Now())
	if _, ok := l.Annotations[takenInPodAnnotation]; ok {
		t.Error("a process outside a pod records no pod")
	}
}

func TestOnlyThisProcessReleases(t *testing.T) {
	me := self{identity: "me", incarnation: "inc"}
	if !mayRelease(lease("me", 3, true, "me/3", "inc"), me) || !mayRelease(lease("me", 3, true, "me/3", ""), me) {
		t.Error("its own term, or a fresh assignment to it")
	}
	if mayRelease(lease("me", 3, true, "me/3", "other"), me) || mayRelease(lease("you", 3, true, "you/3", ""), me) {
		t.Error("another process's term, or someone else's")
	}
	l := lease("me", 3, true, "me/3", "inc")
	release(l, me, time.Now())
	if holder(l) != "" || l.Annotations[releasedByAnnotation] != "me" || term(l) != 3 {
		t.Errorf("released: %+v", l)
	}
}

func TestIdentitiesAreCandidateNames(t *testing.T) {
	for _, ok := range []string{"a", "replica-0", "my.controller-1"} {
		if !validIdentity(ok) {
			t.Errorf("%q refused", ok)
		}
	}
	for _, bad := range []string{"", "A", "-a", "a-", Nobody, "a_b"} {
		if validIdentity(bad) {
			t.Errorf("%q accepted", bad)
		}
	}
}
