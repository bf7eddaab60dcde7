//go:build !testhooks

package node

// callTimeout is what bounds a call: CallTimeout, a constant in every
// build that ships. A test build may shorten it (calltimeout_testhooks.go).
const callTimeout = CallTimeout
