// Package config is the node agent's configuration: the file's schema (Config and its
// sections: NRI, GPU, Signals), its defaults (Default), loading and validation (Load:
// unknown fields and bad values are errors naming the field, wrapping ErrInvalid;
// Lenient: what the start-up thaw can read of a file that does not load), and the
// reload of the file while the agent runs (Reloader).
//
// The Reloader reads the file every DefaultReloadInterval and acts on a changed sha256
// once two reads agree; a valid change goes to the agent (an Applier), which applies the
// live fields (LiveFields, copied by CopyLive) between two periods; the other fields keep
// their start value and are reported (Status.NeedsRestart). An invalid one is refused:
// the configuration in force stays, a Warner records ReasonRejected on the Node, and
// understory_koordlet_config_last_reload_success is 0.
//
// Traps:
//   - A mounted ConfigMap changes by a symlink swap (..data): the file is read by
//     content, never watched with inotify, which would not see the swap.
//   - A file edited in place may be read half-written, and an empty file is a valid
//     configuration (every default): a change counts only when two reads agree.
//   - Live fields are validated together with the fields that stay (minPodCPU against
//     cfsPeriod): a reload valid on its own may be refused with the start values.
//   - YAML 1.1 reads a bare off as false: gpu.mode's off value is "disabled".
package config
