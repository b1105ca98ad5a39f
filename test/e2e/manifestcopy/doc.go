// Package manifestcopy gives an end-to-end test its own copy of the repository's
// manifests/ with freshly generated certificates, so that tests apply the install as
// users do without ever writing into the checkout. test/e2e (kustomize builds, the
// install on a control plane) and test/e2e/realnode (the install on a real node)
// share it. Like controlplane it is a normal package meant to be imported from
// _test.go files only.
//
// Copy copies the tree, file modes kept, leaving out certs/generated (certificates
// an earlier `manifests/certs/generate.sh` wrote into the checkout: a test must not
// install a user's keys, nor depend on them), then runs the copy's
// certs/generate.sh, which writes new ones into the copy.
//
// Traps:
//   - generate.sh needs openssl. Copy looks it up first and returns ErrNoOpenSSL
//     (with the Debian package to install) before copying anything; callers skip on
//     it, or fail under CI=true, where nothing may skip.
//   - Copy does not clean dst up: pass a directory below t.TempDir(). A dst that
//     already holds files is written over, file by file.
//   - The copy is plain files and directories: a symlink to a file in manifests/
//     would be copied as a file with the link's mode, one to a directory fails the
//     copy (there is none today).
package manifestcopy
