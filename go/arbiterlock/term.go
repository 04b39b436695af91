package arbiterlock

import (
	"context"
	"os"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/klog/v2"
)

// The term this process leads, and its deadlines. Every deadline is measured on the boot clock
// (CLOCK_BOOTTIME), which counts a suspended machine's sleep: a process resumed after its lease
// expired finds its term over at once.

// exit ends the process when a term is overdue (a variable for the tests).
var exit = os.Exit

// counts: this process leads a term and may act under it now (l.mu held): the last counted
// renewal was sent less than the renew deadline ago.
func (l *Lock) counts() bool {
	return l.leading && boot()-l.lastOK < l.opts.RenewDeadline
}

// takeable: the Lease, as read, assigns this process a term it may take or renew (l.mu held).
// A term it took before is only ever the one it wrote last; a term it led and ended is never
// taken again; otherwise only a fresh assignment of the arbiter's (standingOf).
func (l *Lock) takeable(lease *coordinationv1.Lease) bool {
	if standingOf(lease, l.me) != ours || l.stopping && !l.leading {
		return false
	}
	t := term(lease)
	if l.hasEnded && t == l.ended {
		return false
	}
	if lease.Annotations[incarnationAnnotation] == l.me.incarnation {
		// Taken by this process: the term it wrote, not one edited in since.
		return l.wrote && t == l.wroteTerm
	}
	return true
}

// givesBack: the Lease, as read, is a fresh assignment to this process (no process took it
// yet) that the arbiter already wants handed over, or that came while the program stops: given
// back unled (l.mu held). Never a term
// this process took: that one is released only by Shutdown, once the work stopped.
func (l *Lock) givesBack(lease *coordinationv1.Lease) bool {
	s := standingOf(lease, l.me)
	wanted := s == handover || s == ours && l.stopping // a stopping program could not use it
	if !wanted || l.leading || l.hasEnded && term(lease) == l.ended {
		return false
	}
	// Untaken, or taken by a write of this process that never counted (its answer lost, or
	// too slow): no work ran under it.
	inc := lease.Annotations[incarnationAnnotation]
	return inc == "" || inc == l.me.incarnation && l.wrote && term(lease) == l.wroteTerm
}

// renewed counts a renewal of term t sent at sent (boot clock); false if the term already ended
// (a renewal in flight when the lock ended it does not bring it back).
func (l *Lock) renewed(log klog.Logger, t int32, sent time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.hasEnded && t == l.ended {
		return false
	}
	started := !l.leading
	l.leading, l.term, l.lastOK = true, t, sent
	if started {
		l.exitArmed = false
		l.notify()
		log.Info("leading", "term", t)
		if cb := l.opts.OnStartedTerm; cb != nil {
			l.callbacks.push(func() { cb(t) })
		}
	}
	return true
}

// endTerm ends the term this process leads, if any (l.mu held). With ExitAtTermEnd, the
// process exits unless Shutdown says its work stopped before the last moment it may act.
func (l *Lock) endTerm(why string) {
	if !l.leading {
		return
	}
	t := l.term
	l.leading, l.stepping = false, false
	l.ended, l.hasEnded = t, true
	l.exitArmed = l.exitAtTermEnd && !l.workStopped
	l.notify()
	klog.Background().Info("leadership ended", "lease", l.opts.LeaseName, "term", t, "reason", why)
	if l.exitArmed {
		klog.Background().Info("ExitAtTermEnd: this process exits unless Shutdown says its work stopped first", "lease", l.opts.LeaseName, "within", l.opts.LeaseDuration-Margin-(boot()-l.lastOK))
	}
	if cb := l.opts.OnEndedTerm; cb != nil {
		l.callbacks.push(func() { cb(t, why) })
	}
}

// overdue: the last moment this process may act under the term it led has passed (l.mu
// held): LeaseDuration − Margin after its last counted renewal, a second before the arbiter,
// waiting a lease duration from when it saw that renewal, may name anyone else (the watchdog's
// tick, at most a quarter second, and the exit itself fit in that second).
func (l *Lock) overdue() bool {
	return boot()-l.lastOK >= l.opts.LeaseDuration-Margin
}

// watchdog keeps the term's deadlines even when nobody calls: the renew deadline, the
// handover's grace, and (ExitAtTermEnd) the process's exit.
func (l *Lock) watchdog(ctx context.Context) {
	tick := time.NewTicker(min(l.opts.RetryPeriod/4, 250*time.Millisecond))
	defer tick.Stop()
	done := ctx.Done()
	for {
		select {
		case <-done:
			if !l.exitPending() {
				return
			}
			done = nil // stopped following: ticks on only for the armed exit
		case <-tick.C:
		}
		l.mu.Lock()
		if l.leading && boot()-l.lastOK > l.opts.RenewDeadline {
			l.endTerm("no renewal for the renew deadline")
		}
		if l.stepping && boot()-l.stepSince > l.opts.StepDownGrace {
			l.endTerm("handed over: the work did not stop within StepDownGrace")
		}
		if l.exitArmed && !l.workStopped && l.overdue() {
			klog.Background().Error(nil, "the term ended and this process still runs at the last moment it may act: exiting (ExitAtTermEnd)", "lease", l.opts.LeaseName, "term", l.ended)
			klog.Flush()
			exit(1)
			l.exitArmed = false
		}
		l.mu.Unlock()
	}
}

// exitPending: an exit is armed (the watchdog outlives Shutdown for it).
func (l *Lock) exitPending() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.exitArmed && !l.workStopped
}

// Term is the term this replica leads at (the fencing token); while it leads none, Term waits
// for one until ctx ends (ErrNotLeading). A term counts until the lock ends it: the renew
// deadline after its last renewal, a handover (after StepDownGrace), another holder.
func (l *Lock) Term(ctx context.Context) (int32, error) {
	for {
		l.mu.Lock()
		if l.counts() {
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
	l.stopCtxs = append(l.stopCtxs, cancel)
	now := l.stepping || l.failed != nil && !l.leading
	l.mu.Unlock()
	if now {
		cancel()
	}
	// Once the program is stopping, a standby takes no term (it could not use it).
	context.AfterFunc(ctx, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.stopping = true
	})
	return ctx
}

// SetExitAtTermEnd turns ExitAtTermEnd on or off (arbiterctrl.Options turns it on).
func (l *Lock) SetExitAtTermEnd(on bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.exitAtTermEnd = on
}

// stepDown: the arbiter asked this leader to hand over (l.mu held). A program that watches
// StepDownContext is told to stop, and renewals go on for StepDownGrace while it does;
// otherwise the term ends now (the elector then stops at its renew deadline, and the Lease
// expires: nothing is released while the work may run).
func (l *Lock) stepDown() {
	if l.stepping || !l.leading {
		return
	}
	l.stepping, l.stepSince = true, boot()
	l.cancelStepDown()
	if !l.wired {
		l.endTerm("handed over")
	}
}

// cancelStepDown cancels every StepDownContext (l.mu held): on a goroutine of its own, since
// a context's cancellation may run code of the program's (its parent's AfterFunc hooks).
func (l *Lock) cancelStepDown() {
	cancels := append([]context.CancelFunc(nil), l.stopCtxs...)
	go func() {
		for _, cancel := range cancels {
			cancel()
		}
	}()
}

// fail: a background task died; the lock never leads again (l.mu not held). A standby is told
// to stop (its program may restart and register again); a leader's term ends, and the elector
// stops at its renew deadline (controller-runtime then exits at once, without its graceful
// shutdown).
func (l *Lock) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	klog.Background().Error(err, "the lock stopped following the lease", "lease", l.opts.LeaseName)
	l.failed = err
	if l.leading {
		l.endTerm("the lock failed")
	} else {
		l.cancelStepDown()
	}
	l.notify()
}

// notify wakes every waiter (l.mu held).
func (l *Lock) notify() {
	close(l.changed)
	l.changed = make(chan struct{})
}
