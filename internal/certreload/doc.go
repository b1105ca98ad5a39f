// Package certreload serves a TLS certificate from a Secret volume's files and picks up
// their rotation (cert-manager, a re-run of the certs component) without a restart. The
// admission webhook and the scheduler extender both serve TLS with it; it lives apart so
// that neither binary imports the other's package.
//
// Traps: kubelet updates a Secret volume by swapping a symlink, so the pair is
// re-read when either file's modification time or size changes, checked on every
// handshake; a half-written or mismatched pair keeps the last good certificate.
package certreload
