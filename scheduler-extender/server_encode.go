package extender

import (
	"encoding/json"
	"strconv"
)

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
func appendFailed(b []byte, vs []verdict) []byte {
	if len(vs) == 0 {
		return append(b, "null"...)
	}
	b = append(b, '{')
	for i, v := range vs {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendBytesString(b, v.name)
		b = append(b, ':')
		b = appendString(b, v.reason)
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

// appendFilterResult writes an ExtenderFilterResult in NodeNames form; it decodes
// with encoding/json into extenderv1.ExtenderFilterResult.
func appendFilterResult(b []byte, out *filterOutcome, errMsg string) []byte {
	b = append(b, `{"Nodes":null,"NodeNames":[`...)
	for i, n := range out.passed {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, n)
	}
	b = append(b, `],"FailedNodes":`...)
	b = appendFailed(b, out.failed)
	b = append(b, `,"FailedAndUnresolvableNodes":`...)
	b = appendFailed(b, out.unresolvable)
	b = append(b, `,"Error":`...)
	b = appendString(b, errMsg)
	return append(b, '}')
}

// appendHostPriorities writes a HostPriorityList; plain says every name is
// printable ASCII without quotes or backslashes (no escaping needed).
func appendHostPriorities(b []byte, names [][]byte, scores []int64, plain bool) []byte {
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
