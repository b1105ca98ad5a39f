// Package wire is the scheduler extender's protocol with kube-scheduler, as
// bytes: it turns request bodies into arguments and results into response
// bodies, and reads what a pod asks for. It is pure (no I/O, no clock, no
// client-go: TestImports checks) and every parser in it is fuzzed.
//
//   - Decoder decodes ExtenderArgs bodies (Args) with a hand-written scanner
//     that keeps node names as slices of the body (docs/extender.md says why
//     it is not a JSON library), falling back to encoding/json for anything
//     it is not sure about, so both accept the same documents. Its two caches:
//     PodCache, the decoded pods by their exact JSON (bounded in count and
//     bytes), and Lists, the one candidate-list cache: NodeNames arrays by
//     their raw bytes, each with what the index resolved it to (List.Resolve).
//     BindingArgs decodes ExtenderBindingArgs.
//   - Outcome is a filter's verdict (passed, failed, unresolvable);
//     AppendFilterResult and AppendHostPriorities write the NodeNames answers
//     without reflection, FilterResultNodes the Nodes form.
//   - PodRequest reads a pod's request (CPU, memory, GPUs, models, batch
//     resources) as kube-scheduler accounts it; KeyOf keys request shapes.
//
// Traps:
//   - Names in Args alias the request body (or the caller's buffer): nothing
//     may keep them past the request. Cached names (Args.Cached) alias the
//     list cache's own copy and must not be written to.
//   - Cached pods are shared between requests: never modify them.
//   - A List's resolution is keyed by the caller's generation: the index must
//     move it whenever the answer could change (its node set).
package wire
