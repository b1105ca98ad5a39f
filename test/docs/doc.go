// Package docs holds tests that keep the project's documentation true to the tree: the
// README's "Layout" section must name every folder that holds a Go package.
//
// Traps: the test reads README.md and walks the tree from the module root (two levels
// up from this package), so it must stay at test/docs; folders without Go files
// (manifests, docs, scripts) are not checked, nor are testdata, bin and hidden folders.
package docs
