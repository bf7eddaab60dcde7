package cluster

import (
	"cmp"
	"context"
	"encoding/json"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	typedeventsv1 "k8s.io/client-go/kubernetes/typed/events/v1"

	"github.com/gcagent/gcagent/nodeevents"
)

// eventsSink is the recorder's sink (record.EventSink) writing
// events.k8s.io/v1 Events: client-go's recorder correlates core/v1
// events, and this turns each into the new API's object (regarding, note,
// action, reporting controller and instance; a count above one as its
// series, which kubectl shows as "x<count> over <age>") and its count
// updates into patches of that object. The new API refuses the deprecated
// core/v1 fields (source, count, first and last timestamp) on create.
type eventsSink struct {
	client typedeventsv1.EventsV1Interface
	m      *metrics
}

// timeout bounds each write.
const sinkTimeout = 10 * time.Second

func (s *eventsSink) Create(e *corev1.Event) (*corev1.Event, error) {
	ctx, cancel := context.WithTimeout(context.Background(), sinkTimeout)
	defer cancel()
	out, err := s.client.Events(e.Namespace).Create(ctx, toEventsV1(e), metav1.CreateOptions{})
	s.count("create", err)
	if err != nil {
		return nil, err
	}
	return toCore(out), nil
}

func (s *eventsSink) Update(e *corev1.Event) (*corev1.Event, error) {
	ctx, cancel := context.WithTimeout(context.Background(), sinkTimeout)
	defer cancel()
	out, err := s.client.Events(e.Namespace).Update(ctx, toEventsV1(e), metav1.UpdateOptions{})
	s.count("update", err)
	if err != nil {
		return nil, err
	}
	return toCore(out), nil
}

// Patch updates what the correlator changed on an existing event: its
// count and last time, as its series (the new API keeps a note as it was
// created). The core/v1 patch the correlator computed names core/v1
// fields, so the patch sent is made from the event itself.
func (s *eventsSink) Patch(e *corev1.Event, _ []byte) (*corev1.Event, error) {
	ctx, cancel := context.WithTimeout(context.Background(), sinkTimeout)
	defer cancel()
	patch, err := json.Marshal(map[string]any{"series": series(e)})
	if err != nil {
		return nil, err
	}
	out, err := s.client.Events(e.Namespace).Patch(ctx, e.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	s.count("patch", err)
	if err != nil {
		return nil, err
	}
	return toCore(out), nil
}

func (s *eventsSink) count(verb string, err error) {
	if err != nil {
		s.m.eventWriteFailures.WithLabelValues(verb).Inc()
		return
	}
	s.m.eventWrites.WithLabelValues(verb).Inc()
}

func toEventsV1(e *corev1.Event) *eventsv1.Event {
	meta := e.ObjectMeta
	// The action goes with the reason: the correlator's combined events
	// carry nothing else of the events they combine.
	action := cmp.Or(nodeevents.ActionOf(e.Reason), "Report")
	at := e.EventTime
	if at.IsZero() {
		at = metav1.MicroTime{Time: e.FirstTimestamp.Time}
	}
	if at.IsZero() {
		at = metav1.NowMicro()
	}
	return &eventsv1.Event{
		ObjectMeta: meta, EventTime: at, Regarding: e.InvolvedObject, Note: e.Message, Type: e.Type, Reason: e.Reason,
		Action: action, ReportingController: eventController, ReportingInstance: eventSource + "@" + e.Source.Host,
		Series: series(e),
	}
}

// series is the events.k8s.io/v1 series of a correlated event: nil for a
// first occurrence.
func series(e *corev1.Event) *eventsv1.EventSeries {
	if e.Count < 2 {
		return nil
	}
	last := e.LastTimestamp.Time
	if last.IsZero() {
		last = time.Now()
	}
	return &eventsv1.EventSeries{Count: e.Count, LastObservedTime: metav1.MicroTime{Time: last}}
}

// toCore is what the recorder keeps of a written event: the core/v1 view,
// with the count its series holds.
func toCore(e *eventsv1.Event) *corev1.Event {
	out := &corev1.Event{ObjectMeta: e.ObjectMeta, InvolvedObject: e.Regarding, Message: e.Note, Type: e.Type, Reason: e.Reason,
		Action: e.Action, Count: 1, EventTime: e.EventTime, ReportingController: e.ReportingController, ReportingInstance: e.ReportingInstance}
	if e.Series != nil {
		out.Count, out.LastTimestamp = e.Series.Count, metav1.Time{Time: e.Series.LastObservedTime.Time}
	}
	return out
}
