package projection

import (
	"encoding/json"
	"slices"
	"strings"
)

// ImageName is one name of an image and the labels gcagent keeps of it
// (events.ImageLabels: a set as CRI writes it is one shared map, any other
// a map of its own, freed with the image).
type ImageName struct {
	Name   string
	Labels map[string]string
}

// ImageNames are an image's names, sorted by name. An image has one to a
// few names: a sorted slice of them costs a fraction of a map's 200 bytes
// and more. In JSON they are an object of name to labels, as when they
// were a map.
type ImageNames []ImageName

func (ns ImageNames) find(name string) (int, bool) {
	return slices.BinarySearchFunc(ns, name, func(n ImageName, name string) int { return strings.Compare(n.Name, name) })
}

// Labels returns the labels of name, and whether the image has that name.
func (ns ImageNames) Labels(name string) (map[string]string, bool) {
	if i, ok := ns.find(name); ok {
		return ns[i].Labels, true
	}
	return nil, false
}

// Strings returns the names, sorted, in a new slice.
func (ns ImageNames) Strings() []string {
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = n.Name
	}
	return out
}

// set gives name the labels, adding it where it sorts.
func (ns *ImageNames) set(name string, labels map[string]string) {
	i, ok := ns.find(name)
	if ok {
		(*ns)[i].Labels = labels
		return
	}
	*ns = slices.Insert(*ns, i, ImageName{name, labels})
}

// remove drops name, if the image has it.
func (ns *ImageNames) remove(name string) {
	if i, ok := ns.find(name); ok {
		*ns = slices.Delete(*ns, i, i+1)
	}
}

// MarshalJSON writes the names as an object of name to labels.
func (ns ImageNames) MarshalJSON() ([]byte, error) {
	m := make(map[string]map[string]string, len(ns))
	for _, n := range ns {
		m[n.Name] = n.Labels
	}
	return json.Marshal(m)
}

// UnmarshalJSON reads an object of name to labels.
func (ns *ImageNames) UnmarshalJSON(b []byte) error {
	var m map[string]map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	*ns = make(ImageNames, 0, len(m))
	for name, labels := range m {
		*ns = append(*ns, ImageName{name, labels})
	}
	*ns = ns.sorted()
	return nil
}

// sorted returns ns sorted by name, in place; of a name given twice the
// last stays, as a map's would.
func (ns ImageNames) sorted() ImageNames {
	slices.SortStableFunc(ns, func(a, b ImageName) int { return strings.Compare(a.Name, b.Name) })
	out := ns[:0]
	for i, n := range ns {
		if i+1 < len(ns) && ns[i+1].Name == n.Name {
			continue // a later one of the same name follows
		}
		out = append(out, n)
	}
	return out
}
