// Package docs holds the operator's documentation (the Markdown files in
// this directory) and its tests: every relative link of the README and of
// docs/*.md resolves to a file, and every anchor to a heading.
package docs
