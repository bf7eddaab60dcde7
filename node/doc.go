// Package node is the node adapter: the only code that talks to containerd
// and CRI. It dials them with deadlines, follows containerd's events,
// lists each managed namespace and looks up the objects an envelope names,
// reads the content facts an image's use is found by (config digest, top
// chain id, a rootfs snapshot's ancestry), and lists CRI's containers.
//
// containerd's envelopes carry little (an image name, a container id), so
// the Source enriches each one with lookups, lists everything after every
// (re)subscribe, and emits a Listing that the projection diffs against its
// own state: a missed event never leaves the state wrong. What it emits
// are the plain, journaled types of package events.
package node
