// Package deploy holds what operators install (the Kubernetes manifest, the
// systemd unit, Prometheus rules, the Grafana dashboard) and reads the
// manifest back strictly, so that tests check the very file operators apply
// and the end-to-end test runs the container the way the DaemonSet says.
package deploy

import (
	_ "embed"
	"errors"
	"fmt"
	"regexp"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// ManifestYAML is deploy/kubernetes/gcagent.yaml.
//
//go:embed kubernetes/gcagent.yaml
var ManifestYAML []byte

// Manifest is the decoded Kubernetes manifest.
type Manifest struct {
	DaemonSet *appsv1.DaemonSet
	ConfigMap *corev1.ConfigMap
}

var docSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

// DecodeManifest decodes data strictly, the way the API server does: an
// unknown, duplicate or wrongly cased field (encoding/json would accept
// readOnlyRootFileSystem), a kind other than DaemonSet or ConfigMap, or a
// missing DaemonSet is an error.
func DecodeManifest(data []byte) (Manifest, error) {
	var m Manifest
	for i, doc := range docSep.Split(string(data), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return m, fmt.Errorf("document %d: %w", i, err)
		}
		var target any
		switch meta.APIVersion + " " + meta.Kind {
		case "apps/v1 DaemonSet":
			if m.DaemonSet != nil {
				return m, fmt.Errorf("document %d: a second DaemonSet", i)
			}
			m.DaemonSet = &appsv1.DaemonSet{}
			target = m.DaemonSet
		case "v1 ConfigMap":
			if m.ConfigMap != nil {
				return m, fmt.Errorf("document %d: a second ConfigMap", i)
			}
			m.ConfigMap = &corev1.ConfigMap{}
			target = m.ConfigMap
		default:
			return m, fmt.Errorf("document %d: unexpected %s %s", i, meta.APIVersion, meta.Kind)
		}
		js, err := yaml.YAMLToJSONStrict([]byte(doc))
		if err != nil {
			return m, fmt.Errorf("document %d (%s): %w", i, meta.Kind, err)
		}
		strict, err := sigsjson.UnmarshalStrict(js, target)
		if err == nil {
			err = errors.Join(strict...)
		}
		if err != nil {
			return m, fmt.Errorf("document %d (%s): %w", i, meta.Kind, err)
		}
	}
	if m.DaemonSet == nil {
		return m, fmt.Errorf("no DaemonSet")
	}
	return m, nil
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// AgentContainer returns the DaemonSet's gcagent container.
func (m Manifest) AgentContainer() (corev1.Container, error) {
	for _, c := range m.DaemonSet.Spec.Template.Spec.Containers {
		if c.Name == "gcagent" {
			return c, nil
		}
	}
	return corev1.Container{}, fmt.Errorf("DaemonSet has no gcagent container")
}

// HostPaths maps each volume mount of the agent container to its host path
// (and whether it is read-only); a mount whose volume is not a hostPath is
// an error.
func (m Manifest) HostPaths() (map[string]corev1.VolumeMount, map[string]string, error) {
	c, err := m.AgentContainer()
	if err != nil {
		return nil, nil, err
	}
	vols := map[string]*corev1.HostPathVolumeSource{}
	for _, v := range m.DaemonSet.Spec.Template.Spec.Volumes {
		vols[v.Name] = v.HostPath
	}
	mounts, hosts := map[string]corev1.VolumeMount{}, map[string]string{}
	for _, vm := range c.VolumeMounts {
		hp := vols[vm.Name]
		if hp == nil {
			return nil, nil, fmt.Errorf("mount %s: volume %q is not a hostPath", vm.MountPath, vm.Name)
		}
		mounts[vm.MountPath], hosts[vm.MountPath] = vm, hp.Path
	}
	return mounts, hosts, nil
}
