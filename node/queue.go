package node

import (
	"sync"
	"time"

	cdevents "github.com/containerd/containerd/v2/core/events"
)

// queue is the bounded hand-off between the receive loop and enrichment.
type queue struct {
	mu         sync.Mutex
	items      []received
	max        int
	overflowed bool
	done       bool
	err        error
	ready      chan struct{}
}

func newQueue(max int) *queue { return &queue{max: max, ready: make(chan struct{}, 1)} }

// received is an envelope and the agent's time of its receipt.
type received struct {
	env *cdevents.Envelope
	at  time.Time
}

// push adds an envelope received at at; it returns false (and remembers the
// overflow) when the queue is full.
func (q *queue) push(env *cdevents.Envelope, at time.Time) bool {
	q.mu.Lock()
	ok := len(q.items) < q.max
	if ok {
		q.items = append(q.items, received{env, at})
	} else {
		q.overflowed = true
	}
	q.mu.Unlock()
	q.signal()
	return ok
}

func (q *queue) close(err error) {
	q.mu.Lock()
	q.done, q.err = true, err
	q.mu.Unlock()
	q.signal()
}

func (q *queue) signal() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// take returns everything queued and resets the overflow flag.
func (q *queue) take() (items []received, overflowed, done bool, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	items, q.items = q.items, nil
	overflowed, q.overflowed = q.overflowed, false
	return items, overflowed, q.done, q.err
}
