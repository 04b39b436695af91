package arbiterlock

import "sync"

// queue runs functions one at a time, in the order pushed, on a goroutine of its own; push never
// waits for them (a callback that blocks holds up only the callbacks after it). Hand-written:
// a dozen lines, where a channel would block its sender once full.
type queue struct {
	mu      sync.Mutex
	pending []func()
	closed  bool
	wake    chan struct{}
}

func newQueue() *queue {
	return &queue{wake: make(chan struct{}, 1)}
}

func (q *queue) push(f func()) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return
	}
	q.pending = append(q.pending, f)
	// Under the lock: close cannot come between the check and the send.
	select {
	case q.wake <- struct{}{}:
	default:
	}
	q.mu.Unlock()
}

// close ends run once what was pushed has been called; later pushes are dropped.
func (q *queue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.closed {
		q.closed = true
		close(q.wake)
	}
}

// run calls what is pushed, until close.
func (q *queue) run() {
	for range q.wake {
		for {
			q.mu.Lock()
			if len(q.pending) == 0 {
				q.mu.Unlock()
				break
			}
			f := q.pending[0]
			q.pending = q.pending[1:]
			q.mu.Unlock()
			f()
		}
	}
}
