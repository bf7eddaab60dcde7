package promzero

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestLabelsCreatesEveryCombinationAtZero(t *testing.T) {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_total", Help: "x"}, []string{"ns", "kind"})
	Labels(v.WithLabelValues, []string{"a", "b"}, []string{"image", "container", "log"})
	if n := testutil.CollectAndCount(v); n != 6 {
		t.Fatalf("%d children, want 6", n)
	}
	want := "# HELP x_total x\n# TYPE x_total counter\n" +
		`x_total{kind="container",ns="a"} 0` + "\n" + `x_total{kind="container",ns="b"} 0` + "\n" +
		`x_total{kind="image",ns="a"} 0` + "\n" + `x_total{kind="image",ns="b"} 0` + "\n" +
		`x_total{kind="log",ns="a"} 0` + "\n" + `x_total{kind="log",ns="b"} 0` + "\n"
	if err := testutil.CollectAndCompare(v, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	empty := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "y_total", Help: "y"}, []string{"ns"})
	Labels(empty.WithLabelValues, nil)
	if n := testutil.CollectAndCount(empty); n != 0 {
		t.Fatalf("an empty set made %d children", n)
	}
}
