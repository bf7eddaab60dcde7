package node

import (
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/gcagent/gcagent/events"
)

func TestFilters(t *testing.T) {
	all := events.Namespaces{All: true, Exclude: events.DefaultExcluded}
	list := events.Namespaces{Names: []string{"default", "k8s.io"}, Exclude: events.DefaultExcluded}
	if got := Filters(all); len(got) != 1 || !strings.Contains(got[0], "namespaces") {
		t.Errorf("Filters(*) = %q: want one filter that includes the namespace topics", got)
	}
	if got := Filters(list); len(got) != 2 || !strings.HasPrefix(got[0], "namespace==default,") {
		t.Errorf("Filters(list) = %q: want one filter per namespace", got)
	}
}

func TestCRILabelsOnlyInCRINamespace(t *testing.T) {
	c := containerFixture(map[string]string{labelCRIKind: "container", labelPodUID: "u", labelPodName: "p", labelContainerName: "c"})
	if ev := containerEventIn(events.CRINamespace, timeZero, c, nil); ev.CRIKind != "container" || ev.PodUID != "u" {
		t.Errorf("in %s: %+v, want a CRI container of pod u", events.CRINamespace, ev)
	}
	if ev := containerEventIn("default", timeZero, c, nil); ev.CRIKind != "" || ev.PodUID != "" || ev.ContainerName != "" {
		t.Errorf("in default: %+v, want a plain container (CRI labels copied by a client mean nothing there)", ev)
	}
}

var timeZero time.Time

func containerFixture(labels map[string]string) containers.Container {
	return containers.Container{ID: "c1", Image: "app:1", Labels: labels}
}
