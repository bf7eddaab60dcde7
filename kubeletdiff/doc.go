// Package kubeletdiff drives the kubelet's own container GC and gcagent's
// container planner over the same generated worlds and compares them.
package kubeletdiff
