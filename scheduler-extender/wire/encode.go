package wire

import (
	"encoding/json"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// Verdict is why one node was refused. Name may alias the request body.
type Verdict struct {
	Name   []byte
	Reason string
}

// ReasonChangedRetry refuses every node of a filter whose choice a concurrent
// change of the cluster invalidated: kube-scheduler retries the pod.
const ReasonChangedRetry = "capacity changed during evaluation; retry"

// Outcome is the extender's verdict on the nodes of one filter call.
// Reasons are generic (never node-specific) so kube-scheduler's summary
// ("0/N nodes are available: ...") groups them.
type Outcome struct {
	Passed       []string
	Failed       []Verdict
	Unresolvable []Verdict
}

// Reset empties o, keeping its slices' memory.
func (o *Outcome) Reset() {
	o.Passed, o.Failed, o.Unresolvable = o.Passed[:0], o.Failed[:0], o.Unresolvable[:0]
}

// Fail refuses name for reason: unresolvable when retrying cannot help until
// the pod changes.
func (o *Outcome) Fail(name []byte, reason string, unresolvable bool) {
	if unresolvable {
		o.Unresolvable = append(o.Unresolvable, Verdict{name, reason})
	} else {
		o.Failed = append(o.Failed, Verdict{name, reason})
	}
}

// FailAll refuses every one of names.
func (o *Outcome) FailAll(names [][]byte, reason string, unresolvable bool) {
	for _, b := range names {
		o.Fail(b, reason, unresolvable)
	}
}

// FailOthers refuses every node but keep.
func (o *Outcome) FailOthers(names [][]byte, keep, reason string) {
	for _, b := range names {
		if string(b) != keep {
			o.Fail(b, reason, false)
		}
	}
}

// Maps renders the verdicts as extenderv1.FailedNodesMap (for the Nodes form).
func (o *Outcome) Maps() (failed, unresolvable extenderv1.FailedNodesMap) {
	conv := func(vs []Verdict) extenderv1.FailedNodesMap {
		if len(vs) == 0 {
			return nil
		}
		m := make(extenderv1.FailedNodesMap, len(vs))
		for _, v := range vs {
			m[string(v.Name)] = v.Reason
		}
		return m
	}
	return conv(o.Failed), conv(o.Unresolvable)
}

// appendString appends s as a JSON string. Plain ASCII is written as is; anything
// else goes through encoding/json.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			q, _ := json.Marshal(s) // a string always marshals
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// appendFailed appends verdicts as a FailedNodesMap, in request order. A name
// given twice appears twice; decoders keep the last, as they would for a map.
func appendFailed(b []byte, vs []Verdict) []byte {
	if len(vs) == 0 {
		return append(b, "null"...)
	}
	b = append(b, '{')
	for i, v := range vs {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendBytesString(b, v.Name)
		b = append(b, ':')
		b = appendString(b, v.Reason)
	}
	return append(b, '}')
}

// appendBytesString is appendString for a byte slice, without converting plain ASCII.
func appendBytesString(b, s []byte) []byte {
	for _, c := range s {
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			return appendString(b, string(s))
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// AppendFilterResult writes an ExtenderFilterResult in NodeNames form; it decodes
// with encoding/json into extenderv1.ExtenderFilterResult.
func AppendFilterResult(b []byte, out *Outcome, errMsg string) []byte {
	b = append(b, `{"Nodes":null,"NodeNames":[`...)
	for i, n := range out.Passed {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, n)
	}
	b = append(b, `],"FailedNodes":`...)
	b = appendFailed(b, out.Failed)
	b = append(b, `,"FailedAndUnresolvableNodes":`...)
	b = appendFailed(b, out.Unresolvable)
	b = append(b, `,"Error":`...)
	b = appendString(b, errMsg)
	return append(b, '}')
}

// FilterResultNodes is an ExtenderFilterResult in Nodes form: the nodes of
// the request (in its order) that out passed, and out's refusals.
func FilterResultNodes(out *Outcome, nodes *corev1.NodeList) ([]byte, error) {
	res := extenderv1.ExtenderFilterResult{Nodes: &corev1.NodeList{}}
	res.FailedNodes, res.FailedAndUnresolvableNodes = out.Maps()
	for i := range nodes.Items {
		for _, p := range out.Passed {
			if nodes.Items[i].Name == p {
				res.Nodes.Items = append(res.Nodes.Items, nodes.Items[i])
			}
		}
	}
	return json.Marshal(res)
}

// FilterError is an ExtenderFilterResult that carries only the error msg.
func FilterError(msg string) []byte {
	body, _ := json.Marshal(extenderv1.ExtenderFilterResult{Error: msg}) // a string always marshals
	return body
}

// BindingResult is an ExtenderBindingResult with the error msg ("": bound).
func BindingResult(msg string) []byte {
	if msg == "" {
		return []byte(`{"Error":""}`)
	}
	body, _ := json.Marshal(extenderv1.ExtenderBindingResult{Error: msg}) // a string always marshals
	return body
}

// AppendHostPriorities writes a HostPriorityList; plain says every name is
// printable ASCII without quotes or backslashes (no escaping needed).
func AppendHostPriorities(b []byte, names [][]byte, scores []int64, plain bool) []byte {
	b = append(b, '[')
	for i, n := range names {
		if i > 0 {
			b = append(b, ',')
		}
		if plain {
			b = append(b, `{"Host":"`...)
			b = append(b, n...)
			b = append(b, `","Score":`...)
		} else {
			b = append(b, `{"Host":`...)
			b = appendBytesString(b, n)
			b = append(b, `,"Score":`...)
		}
		b = strconv.AppendInt(b, scores[i], 10)
		b = append(b, '}')
	}
	return append(b, ']')
}
