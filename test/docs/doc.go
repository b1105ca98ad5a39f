// Package docs holds tests that keep the project's documentation true to the tree:
//
//   - docs/layout.md names every folder that holds a Go package, and no folder that
//     does not exist;
//   - README.md stays an entrance (at most 250 lines) and its Install section keeps the
//     release install commands the real-node test TestInstallFromRegistry follows;
//   - docs/README.md lists every document of docs/, and every relative link of
//     README.md and the docs resolves to a file (and a heading, for a #fragment);
//   - docs/extender.md's count of each extender type's methods matches the code.
//
// Traps: the tests read the files and walk the tree from the module root (two levels
// up from this package), so they must stay at test/docs; folders without Go files
// (manifests, docs, scripts) are not checked for the layout, nor are testdata, bin and
// hidden folders. Headings' anchors are GitHub's: lower case, punctuation dropped but
// '-' and '_', spaces become '-'.
package docs
