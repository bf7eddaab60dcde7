package gc

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

var _ Intender = (*intentPublisher)(nil)

// intentPublisher is a fakePublisher that also records intents, and
// checks each against what the runtime had deleted when it was recorded.
type intentPublisher struct {
	fakePublisher
	mu       sync.Mutex
	log      []string // "intend S", "abandon S", "publish S" in order
	deleted  func(subject string) bool
	early    []string // intents recorded after their delete
	pending  map[string]int
	intentsN int
}

func (p *intentPublisher) note(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.log = append(p.log, s)
}

func (p *intentPublisher) Intend(a Action) error {
	p.mu.Lock()
	if p.pending == nil {
		p.pending = map[string]int{}
	}
	p.pending[a.Subject]++
	p.intentsN++
	if p.deleted(a.Subject) {
		p.early = append(p.early, a.Subject)
	}
	p.mu.Unlock()
	p.note("intend " + a.Subject)
	return nil
}

func (p *intentPublisher) Abandon(a Action) error {
	p.mu.Lock()
	p.pending[a.Subject]--
	p.mu.Unlock()
	p.note("abandon " + a.Subject)
	return nil
}

func (p *intentPublisher) Publish(a Action) error {
	p.mu.Lock()
	if p.pending[a.Subject] > 0 && a.Action == "removed" {
		p.pending[a.Subject]--
	}
	p.mu.Unlock()
	p.note("publish " + a.Kind + "." + a.Action + " " + a.Subject)
	return p.fakePublisher.Publish(a)
}

func (p *intentPublisher) Log() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.log)
}

// unresolved returns the subjects whose intents were neither published nor abandoned.
func (p *intentPublisher) unresolved() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for s, n := range p.pending {
		if n != 0 {
			out = append(out, s)
		}
	}
	return out
}

// TestContainerExecutorIntentBeforeDelete: with an Intender publisher,
// each delete is preceded by its intent (recorded while the runtime still
// had the container), a delete that fails abandons it, a removal's event
// follows its intent, and nothing is left unresolved; a dry run records no
// intent.
func TestContainerExecutorIntentBeforeDelete(t *testing.T) {
	plan := PlanContainers(nodeState(), allPolicy, at(time.Minute))
	f := newFakeContainerRuntime()
	f.InjectError("cri-remove", "app-2", errors.New("boom"))
	pub := &intentPublisher{deleted: func(id string) bool {
		for _, c := range f.Deletes() {
			if strings.HasSuffix(c, " "+id) {
				return true
			}
		}
		return false
	}}
	e := NewContainerExecutor(f, ContainerExecutorOptions{Publisher: pub, Parallelism: 1, Now: func() time.Time { return at(time.Minute) }})
	if _, err := e.Apply(context.Background(), plan, allPolicy); err == nil {
		t.Fatal("want the injected error")
	}
	want := []string{
		"intend n-dead", "publish container.removed n-dead",
		"intend app-1", "publish container.removed app-1",
		"intend app-2", "abandon app-2",
	}
	if got := pub.Log(); !slices.Equal(got, want) {
		t.Errorf("intents and events\n got %v\nwant %v", got, want)
	}
	if len(pub.early) > 0 || len(pub.unresolved()) > 0 {
		t.Errorf("intents after their delete %v, unresolved %v", pub.early, pub.unresolved())
	}

	dry := &intentPublisher{deleted: func(string) bool { return false }}
	e = NewContainerExecutor(newFakeContainerRuntime(), ContainerExecutorOptions{Publisher: dry, DryRun: true, Parallelism: 1})
	if _, err := e.Apply(context.Background(), plan, allPolicy); err != nil {
		t.Fatal(err)
	}
	if dry.intentsN != 0 {
		t.Errorf("a dry run recorded %d intents", dry.intentsN)
	}
}

// TestImageExecutorIntentBeforeDelete: the image executor records the
// intent (key digest@firstSeen) while the image still has its names, a
// failed delete abandons it, a removal's emit comes after its intent.
func TestImageExecutorIntentBeforeDelete(t *testing.T) {
	n := newNode()
	n.rt.InjectError("remove", digestOf("b"), errors.New("boom"))
	pub := &intentPublisher{deleted: func(d string) bool { return slices.Contains(n.rt.Removed(), d) }}
	x := n.executor(policy8070)
	x.pub = pub
	x.emit = func(o ImageOutcome) { pub.note(o.Action + " " + o.Digest) }
	res := x.execute(context.Background(), n.plan(policy8070, at(time.Hour)))
	if res.Removed == 0 {
		t.Fatal("nothing removed")
	}
	log := pub.Log()
	if len(log) < 4 || log[0] != "intend "+digestOf("a") || log[1] != "removed "+digestOf("a") ||
		log[2] != "intend "+digestOf("b") || log[3] != "abandon "+digestOf("b") {
		t.Errorf("intents and outcomes: %v", log)
	}
	intents := 0
	for _, l := range log {
		if strings.HasPrefix(l, "intend ") {
			intents++
		}
	}
	if intents != res.Removed+1 {
		t.Errorf("%d intents for %d removals and one failure: %v", intents, res.Removed, log)
	}
	if len(pub.early) > 0 {
		t.Errorf("intents recorded after their delete: %v", pub.early)
	}
}
