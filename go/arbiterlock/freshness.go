package arbiterlock

import (
	"slices"
	"time"
)

// freshness is what the replica knows of its own candidate, and when it writes it next: the Rust
// agent's rules (crates/candidate/src/registration.rs, Freshness). Pure: fed what the watch or a read
// delivers and how each write went.
type freshness struct {
	incarnation string
	// next is when the next refresh is due.
	next time.Time
	// contested: another process's incarnation is on the candidate (as last seen).
	contested bool
	// others: the other incarnations seen so far, each answered once within
	// refreshOnNewOther; at most othersKept.
	others []string
	// pending: a renewTime that could not be written (a ping's answer), written with the next try.
	pending *time.Time
	// answered: the last ping answered. Each ping is answered once, by writing a renewTime
	// other than the one the candidate carries: the arbiter counts such a change, seen after its
	// ping, as the answer, whatever either clock says.
	answered *time.Time
}

func newFreshness(incarnation string, now time.Time, answered *time.Time) *freshness {
	return &freshness{incarnation: incarnation, next: now.Add(refresh), answered: answered}
}

// seen takes the candidate as seen at now (wall: this machine's clock); it returns the
// renewTime to write at once when the candidate carries a ping not answered yet.
func (f *freshness) seen(c candidateSeen, now, wall time.Time) (time.Time, bool) {
	otherInc := c.incarnation != "" && c.incarnation != f.incarnation
	if otherInc {
		isNew := !slices.Contains(f.others, c.incarnation)
		// Not while a failed write waits out its backoff.
		if isNew && f.pending == nil {
			f.next = earliest(f.next, now.Add(refreshOnNewOther))
		} else if !f.contested {
			f.next = earliest(f.next, now.Add(refreshContested))
		}
		if isNew {
			if len(f.others) == othersKept {
				f.others = f.others[1:]
			}
			f.others = append(f.others, c.incarnation)
		}
	}
	f.contested = otherInc
	if c.ping == nil || (f.answered != nil && f.answered.Equal(*c.ping)) {
		return time.Time{}, false
	}
	ping := *c.ping
	f.answered = &ping
	renew := f.takePending(later(ping, wall))
	return otherThan(renew, c.renew), true
}

// takePending is the renewTime to write now: renew, or the one a failed write left if later.
func (f *freshness) takePending(renew time.Time) time.Time {
	if f.pending != nil {
		renew = later(*f.pending, renew)
		f.pending = nil
	}
	return renew
}

// written: the write succeeded at now.
func (f *freshness) written(now time.Time) {
	if f.contested {
		f.next = now.Add(refreshContested)
	} else {
		f.next = now.Add(refresh)
	}
}

// failed: the write of renew failed at now; tried again after wait.
func (f *freshness) failed(renew time.Time, now time.Time, wait time.Duration) {
	f.pending = &renew
	f.next = now.Add(wait)
}

// otherThan is renew to the microsecond (as the API server keeps it), a microsecond later if
// that is current: an answer must change the candidate's renewTime.
func otherThan(renew time.Time, current *time.Time) time.Time {
	renew = renew.Truncate(time.Microsecond)
	if current != nil && current.Truncate(time.Microsecond).Equal(renew) {
		return renew.Add(time.Microsecond)
	}
	return renew
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
