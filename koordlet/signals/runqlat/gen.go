package runqlat

// The BPF object and its Go loader (runqlat_bpfel.o, runqlat_bpfel.go) are
// generated from bpf/runqlat.c and committed, so building needs no clang.
// Regenerate with `make bpf-generate` (clang, llvm-strip and libbpf's headers
// from Debian's clang, llvm and libbpf-dev). bpf2go comes from go.mod's
// github.com/cilium/ebpf, so the generated code matches the library.
//
// runqlatpoll_bpfel.o is the same source without the slow-event ring buffer
// (RUNQLAT_NO_RINGBUF), for kernels before 5.8: the verifier refuses a
// program that calls bpf_ringbuf_output there, even on a path never taken.
//
// Only little-endian BPF (bpfel) is built: amd64 and arm64. bpf/vmlinux.h is
// a trimmed `bpftool btf dump file /sys/kernel/btf/vmlinux format c`; every
// type in it is CO-RE relocated at load, so the kernel the header was taken
// from does not matter.

//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -target bpfel -no-global-types -go-package runqlat runqlat bpf/runqlat.c -- -O2 -g -Wall -Werror -I/usr/include
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -target bpfel -no-global-types -go-package runqlat runqlatpoll bpf/runqlat.c -- -O2 -g -Wall -Werror -I/usr/include -DRUNQLAT_NO_RINGBUF
