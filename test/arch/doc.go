// Package arch measures the shape of the scheduler extender's packages, so that
// a review's numbers can be measured again on the same definitions:
//
//   - lines: newline characters in a package's non-test Go files;
//   - back-references: references from one file of a package to another
//     that refers back to the first, counted per ordered pair of files
//     (Package.BackRefs has the precise definition);
//   - the files a filter call visits: the files holding the functions of a
//     package that its filter handler reaches through a static call graph of
//     that package's own functions (Reach);
//   - methods per type (Package.Methods).
//
// It loads packages with go/parser and go/types, importing every dependency
// from the export data `go list -export -deps` builds; the measurement needs
// the go command and reads the tree from the module root, two levels up.
// TestExtenderShape logs every number (go test -v ./test/arch) and holds the
// extender to its targets.
//
// It also holds the module to its import rules (Rules, imports.go): production
// code imports neither bench/ nor test/, nothing outside test/ imports test/,
// koordlet and the scheduler extender import nothing of each other, admission
// neither of them, qos neither cgroups nor metrics, contract nothing of the module,
// internal/ holds only leaves (IsLeaf), and production links no test harness
// (TestHarnesses). LoadGraph reads every package's imports
// from all its Go files, build tags or not; TestImportRules fails on each import
// that breaks a rule, naming both packages (Check takes exceptions; the module needs none).
package arch
