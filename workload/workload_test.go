package workload

import (
	"encoding/json"
	"reflect"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

func spec(images ...string) corev1.PodSpec {
	var s corev1.PodSpec
	for _, im := range images {
		s.Containers = append(s.Containers, corev1.Container{Name: "c", Image: im, Command: []string{"sleep", "1"},
			Env: []corev1.EnvVar{{Name: "A", Value: "a long value the informer need not keep"}}})
	}
	return s
}

func meta(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: "shop", UID: types.UID("uid-" + name), ResourceVersion: "7",
		Labels: map[string]string{"app": name}, Annotations: map[string]string{"big": "x"}}
}

// TestOfEveryKind: each kind declares its template's images, whatever its
// replicas or suspension; a pod's init, ephemeral containers and image
// volumes count; references are normalized; invalid ones declare nothing.
func TestOfEveryKind(t *testing.T) {
	full := spec("nginx:1.25", "nginx:1.25")
	full.InitContainers = []corev1.Container{{Name: "init", Image: "busybox"}}
	full.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "dbg", Image: "ghcr.io/org/debug:1"}}}
	full.Volumes = []corev1.Volume{{Name: "model", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: "registry:5000/model@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}}},
		{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	tmpl := corev1.PodTemplateSpec{Spec: spec("app:2")}
	dsRev, _ := json.Marshal(map[string]any{"spec": map[string]any{"template": map[string]any{"$patch": "replace", "spec": map[string]any{
		"containers": []map[string]any{{"name": "agent", "image": "agent:0.9"}}}}}})
	cases := []struct {
		obj  runtime.Object
		kind string
		want []string
	}{
		{&corev1.Pod{ObjectMeta: meta("p"), Spec: full}, "Pod", []string{"docker.io/library/busybox:latest", "docker.io/library/nginx:1.25",
			"ghcr.io/org/debug:1", "registry:5000/model@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}},
		{&appsv1.Deployment{ObjectMeta: meta("d"), Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](0), Template: tmpl}}, "Deployment", []string{"docker.io/library/app:2"}},
		{&appsv1.ReplicaSet{ObjectMeta: meta("d-1"), Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](0), Template: tmpl}}, "ReplicaSet", []string{"docker.io/library/app:2"}},
		{&appsv1.StatefulSet{ObjectMeta: meta("s"), Spec: appsv1.StatefulSetSpec{Template: tmpl}}, "StatefulSet", []string{"docker.io/library/app:2"}},
		{&appsv1.DaemonSet{ObjectMeta: meta("ds"), Spec: appsv1.DaemonSetSpec{Template: tmpl}}, "DaemonSet", []string{"docker.io/library/app:2"}},
		{&appsv1.ControllerRevision{ObjectMeta: meta("ds-5f"), Data: runtime.RawExtension{Raw: dsRev}, Revision: 3}, "ControllerRevision", []string{"docker.io/library/agent:0.9"}},
		{&batchv1.Job{ObjectMeta: meta("j"), Spec: batchv1.JobSpec{Template: tmpl}}, "Job", []string{"docker.io/library/app:2"}},
		{&batchv1.CronJob{ObjectMeta: meta("cj"), Spec: batchv1.CronJobSpec{Suspend: ptr.To(true),
			JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: spec("report:7", "Bad:Ref", "")}}}}}, "CronJob", []string{"docker.io/library/report:7"}},
	}
	for _, c := range cases {
		d, ok := Of(c.obj)
		if !ok || d.Workload.Kind != c.kind || d.Workload.Namespace != "shop" || !slices.Equal(d.Images, c.want) {
			t.Errorf("%T: %+v %v; want %s %v", c.obj, d, ok, c.kind, c.want)
		}
		if c.kind == "CronJob" && !slices.Equal(d.Invalid, []string{"Bad:Ref"}) {
			t.Errorf("CronJob invalid %v", d.Invalid)
		}
		if _, ok := KindOf(resourceOf(c.kind)); !ok {
			t.Errorf("no Kind for %s", c.kind)
		}
		// The stripped copy the informers store declares the same.
		s, err := Strip(c.obj)
		if err != nil {
			t.Fatal(err)
		}
		ds, _ := Of(s)
		if !reflect.DeepEqual(ds, d) {
			t.Errorf("%s stripped declares %+v, the object %+v", c.kind, ds, d)
		}
		o, ok := s.(*Object)
		if !ok || o.Name != c.obj.(metav1.Object).GetName() || o.UID == "" || o.ResourceVersion != "7" {
			t.Errorf("%s stripped: %#v", c.kind, s)
		}
		if cp := o.DeepCopyObject().(*Object); !reflect.DeepEqual(cp, o) {
			t.Errorf("%s: the copy differs", c.kind)
		}
	}
	if _, ok := Of(&corev1.Node{}); ok {
		t.Error("a Node declares images")
	}
	if s, _ := Strip(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}); s.(*corev1.Node).Name != "n" {
		t.Error("Strip changed a Node")
	}
}

func resourceOf(kind string) string {
	for _, k := range Kinds {
		if k.Name == kind {
			return k.Resource
		}
	}
	return ""
}
