package fleet

// ImageLabel names an image as an operator reads it: its names (tags
// first; CRI's sha256: id names left out) and the digest, shortened; the
// short digest alone without a name. Namespace is said when it is not
// CRI's.
func ImageLabel(namespace string, names []string, digest string) string {
	return inNamespace(namespace, imageLabel(names, digest))
}

// ContainerLabel names a removed container: pod namespace/name and
// container name for CRI containers, the id shortened; the id alone for a
// plain container. Namespace is said when it is not CRI's.
func ContainerLabel(namespace, id, podNamespace, podName, container string) string {
	return inNamespace(namespace, containerLabel(id, podNamespace, podName, container))
}
