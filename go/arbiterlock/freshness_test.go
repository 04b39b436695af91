package arbiterlock

import (
	"testing"
	"time"
)

// The Rust agent's cases (crates/candidate/src/registration.rs), for the same rules.
func TestAPingIsAnsweredOnceAtOnceAndNotBeforeThePing(t *testing.T) {
	t0 := time.Now()
	wall := t0.Truncate(time.Microsecond)
	f := newFreshness("me", t0, nil)
	ping := wall.Add(5 * time.Second) // this machine's clock is 5 s behind the arbiter's
	old := wall.Add(-time.Minute)
	c := candidateSeen{incarnation: "me", ping: &ping, renew: &old}
	if got, ok := f.seen(c, t0, wall); !ok || !got.Equal(ping) {
		t.Fatalf("answered with %v %v, want the ping's time", got, ok)
	}
	if _, ok := f.seen(c, t0, wall.Add(9*time.Second)); ok {
		t.Fatal("the same ping again is not answered again")
	}
	next := wall.Add(20 * time.Second)
	if got, ok := f.seen(candidateSeen{incarnation: "me", ping: &next, renew: &ping}, t0, wall.Add(30*time.Second)); !ok || !got.Equal(wall.Add(30*time.Second)) {
		t.Fatalf("a new ping: %v %v", got, ok)
	}
}

func TestAnAnswerChangesRenewTimeWhateverThisMachinesClockSays(t *testing.T) {
	t0 := time.Now()
	wall := t0.Truncate(time.Microsecond)
	ahead := wall.Add(10 * time.Minute)
	f := newFreshness("me", t0, nil)
	got, ok := f.seen(candidateSeen{incarnation: "me", ping: &wall, renew: &ahead}, t0, ahead)
	if !ok || !got.After(ahead) {
		t.Fatalf("answered %v %v, want after %v", got, ok, ahead)
	}
	g := newFreshness("me", t0, &wall)
	if _, ok := g.seen(candidateSeen{incarnation: "me", ping: &wall, renew: &ahead}, t0, ahead); ok {
		t.Fatal("the ping the registration answered is not answered again")
	}
}

func TestAnotherProcessOnTheCandidateIsAnsweredWithinSecondsThenEvery30s(t *testing.T) {
	t0 := time.Now()
	f := newFreshness("me", t0, nil)
	if !f.next.Equal(t0.Add(refresh)) {
		t.Fatalf("alone: every five minutes, got %v", f.next.Sub(t0))
	}
	t1 := t0.Add(100 * time.Second)
	f.seen(candidateSeen{incarnation: "other"}, t1, t1)
	if !f.contested || !f.next.Equal(t1.Add(refreshOnNewOther)) {
		t.Fatalf("a new other process: within seconds, got %v", f.next.Sub(t1))
	}
	t2 := t1.Add(refreshOnNewOther)
	f.written(t2)
	f.seen(candidateSeen{incarnation: "other"}, t2, t2)
	if !f.next.Equal(t2.Add(refreshContested)) {
		t.Fatalf("the same other again: every 30 s, got %v", f.next.Sub(t2))
	}
	h := newFreshness("me", t0, nil)
	h.failed(t0, t0, 40*time.Second)
	h.seen(candidateSeen{incarnation: "other"}, t0, t0)
	if !h.next.Equal(t0.Add(refreshContested)) {
		t.Fatalf("a failed write's backoff is cut to 30 s at most, not to seconds: %v", h.next.Sub(t0))
	}
}

func TestAFailedAnswerIsRetriedWithoutGoingBelowThePing(t *testing.T) {
	t0 := time.Now()
	wall := t0.Truncate(time.Microsecond)
	f := newFreshness("me", t0, nil)
	ping := wall.Add(5 * time.Second)
	renew, _ := f.seen(candidateSeen{incarnation: "me", ping: &ping}, t0, wall)
	f.failed(renew, t0, 2*time.Second)
	if got := f.takePending(wall.Add(2 * time.Second)); !got.Equal(ping) {
		t.Fatalf("retried at %v, want the ping's %v", got, ping)
	}
	if got := f.takePending(wall.Add(3 * time.Second)); !got.Equal(wall.Add(3 * time.Second)) {
		t.Fatal("once written, nothing is carried over")
	}
}
