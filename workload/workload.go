// Package workload says which images a Kubernetes object declares: the
// pod spec of a Pod (containers, init and ephemeral containers, image
// volumes) and the pod template of a Deployment, ReplicaSet, StatefulSet,
// DaemonSet, Job, CronJob or ControllerRevision (the revision a
// StatefulSet's or DaemonSet's rollback returns to), whatever their
// replicas or suspension. It is pure: the cluster component's informers
// hand it objects.
package workload

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gcagent/gcagent/declared"
)

// Kind is one kind of object that declares images.
type Kind struct {
	// Resource is the API resource (plural, lower case), as --kinds and
	// RBAC rules name it.
	Resource string
	// Group is its API group ("" for the core group).
	Group string
	// Name is its kind as objects and `gcagent ctl keep` name it.
	Name string
}

// Kinds are every kind the cluster component can read, in the order it
// starts their informers.
var Kinds = []Kind{
	{Resource: "pods", Group: "", Name: "Pod"},
	{Resource: "deployments", Group: "apps", Name: "Deployment"},
	{Resource: "replicasets", Group: "apps", Name: "ReplicaSet"},
	{Resource: "statefulsets", Group: "apps", Name: "StatefulSet"},
	{Resource: "daemonsets", Group: "apps", Name: "DaemonSet"},
	{Resource: "controllerrevisions", Group: "apps", Name: "ControllerRevision"},
	{Resource: "jobs", Group: "batch", Name: "Job"},
	{Resource: "cronjobs", Group: "batch", Name: "CronJob"},
}

// KindOf returns the Kind of resource, and false for one no Kind names.
func KindOf(resource string) (Kind, bool) {
	i := slices.IndexFunc(Kinds, func(k Kind) bool { return k.Resource == resource })
	if i < 0 {
		return Kind{}, false
	}
	return Kinds[i], true
}

// Declares is what one object declares: the workload and the normalized
// references of the images it names (declared.Normalize), sorted, each
// once. Invalid lists the references that are not ones (a runtime could
// not pull them either): they declare nothing.
type Declares struct {
	Workload declared.Workload
	Images   []string
	Invalid  []string
}

// Of returns what obj declares, and false for an object of no Kind.
func Of(obj any) (Declares, bool) {
	var d Declares
	var om metav1.ObjectMeta
	var specs []*corev1.PodSpec
	switch o := obj.(type) {
	case *Object:
		return o.Declares, true
	case *corev1.Pod:
		d.Workload.Kind, om, specs = "Pod", o.ObjectMeta, []*corev1.PodSpec{&o.Spec}
	case *appsv1.Deployment:
		d.Workload.Kind, om, specs = "Deployment", o.ObjectMeta, []*corev1.PodSpec{&o.Spec.Template.Spec}
	case *appsv1.ReplicaSet:
		d.Workload.Kind, om, specs = "ReplicaSet", o.ObjectMeta, []*corev1.PodSpec{&o.Spec.Template.Spec}
	case *appsv1.StatefulSet:
		d.Workload.Kind, om, specs = "StatefulSet", o.ObjectMeta, []*corev1.PodSpec{&o.Spec.Template.Spec}
	case *appsv1.DaemonSet:
		d.Workload.Kind, om, specs = "DaemonSet", o.ObjectMeta, []*corev1.PodSpec{&o.Spec.Template.Spec}
	case *batchv1.Job:
		d.Workload.Kind, om, specs = "Job", o.ObjectMeta, []*corev1.PodSpec{&o.Spec.Template.Spec}
	case *batchv1.CronJob:
		d.Workload.Kind, om, specs = "CronJob", o.ObjectMeta, []*corev1.PodSpec{&o.Spec.JobTemplate.Spec.Template.Spec}
	case *appsv1.ControllerRevision:
		d.Workload.Kind, om = "ControllerRevision", o.ObjectMeta
		if spec, err := revisionSpec(o); err == nil {
			specs = []*corev1.PodSpec{spec}
		} else {
			d.Invalid = append(d.Invalid, err.Error())
		}
	default:
		return d, false
	}
	d.Workload.Namespace, d.Workload.Name = om.Namespace, om.Name
	for _, spec := range specs {
		for _, ref := range SpecImages(spec) {
			n, err := declared.Normalize(ref)
			if err != nil {
				d.Invalid = append(d.Invalid, ref)
				continue
			}
			d.Images = append(d.Images, n)
		}
	}
	slices.Sort(d.Images)
	d.Images = slices.Compact(d.Images)
	return d, true
}

// SpecImages returns the image references a pod spec names as written:
// its containers', init containers' and ephemeral containers' images and
// its image volumes' references. An empty reference (a template a
// controller fills in) names nothing.
func SpecImages(spec *corev1.PodSpec) []string {
	var out []string
	add := func(ref string) {
		if ref = strings.TrimSpace(ref); ref != "" {
			out = append(out, ref)
		}
	}
	for _, c := range spec.InitContainers {
		add(c.Image)
	}
	for _, c := range spec.Containers {
		add(c.Image)
	}
	for _, c := range spec.EphemeralContainers {
		add(c.Image)
	}
	for _, v := range spec.Volumes {
		if v.Image != nil {
			add(v.Image.Reference)
		}
	}
	return out
}

// revisionSpec reads the pod spec of a ControllerRevision: its data is
// the owner's spec.template as a patch (DaemonSets and StatefulSets both
// store it so, with "$patch": "replace").
func revisionSpec(cr *appsv1.ControllerRevision) (*corev1.PodSpec, error) {
	raw := cr.Data.Raw
	if raw == nil && cr.Data.Object != nil {
		b, err := json.Marshal(cr.Data.Object)
		if err != nil {
			return nil, err
		}
		raw = b
	}
	var data struct {
		Spec struct {
			Template corev1.PodTemplateSpec `json:"template"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(raw, &data); err != nil {
		return nil, fmt.Errorf("controller revision %s/%s: %w", cr.Namespace, cr.Name, err)
	}
	return &data.Spec.Template.Spec, nil
}

// Object is what an informer keeps of an object that declares images:
// its kind, name, namespace, uid and resource version, and what it
// declares. It is a runtime.Object, so that client-go's stores hold it.
type Object struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Declares          Declares `json:"declares"`
}

// DeepCopyObject copies o (runtime.Object).
func (o *Object) DeepCopyObject() runtime.Object {
	c := *o
	o.ObjectMeta.DeepCopyInto(&c.ObjectMeta)
	c.Declares.Images = slices.Clone(o.Declares.Images)
	c.Declares.Invalid = slices.Clone(o.Declares.Invalid)
	return &c
}

// Strip returns what an informer keeps of obj: an *Object with what Of
// makes of it (a few hundred bytes, where a pod's spec and status take
// kilobytes: 50,000 pods cost megabytes, not the hundreds of megabytes
// their typed objects would). It is an informer transform
// (cache.TransformFunc); an object of no Kind, or a tombstone, is
// returned as it is.
func Strip(obj any) (any, error) {
	d, ok := Of(obj)
	if !ok {
		return obj, nil
	}
	if o, ok := obj.(*Object); ok {
		return o, nil
	}
	m, err := apimeta.Accessor(obj)
	if err != nil {
		return obj, nil
	}
	out := &Object{TypeMeta: metav1.TypeMeta{Kind: d.Workload.Kind}, Declares: d}
	out.Name, out.Namespace, out.UID, out.ResourceVersion = m.GetName(), m.GetNamespace(), m.GetUID(), m.GetResourceVersion()
	return out, nil
}
