package kubectlunderstory

import (
	"encoding/json"
	"io"
	"testing"
)

// FuzzAgentStatus feeds the table writer whatever the pod proxy may return: a body that
// decodes as the agent's /status must print without a panic (missing parts, nulls,
// extreme numbers).
func FuzzAgentStatus(f *testing.F) {
	f.Add(agentStatusJSON(f, false))
	f.Add(agentStatusJSON(f, true))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"signals":{"lastCut":null},"pods":{"batch":[{"quotaCores":null}]}}`))
	f.Add([]byte(`{"budget":{"nodeCPUs":1e308,"threshold":1e308},"memoryBytes":{"used":-1e300}}`))
	f.Add([]byte(`{"escalation":{"level":"evict","starvedFor":"1h"}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var st AgentStatus
		if json.Unmarshal(body, &st) != nil {
			return
		}
		r := NodeReport{Node: "n", Agent: "ns/a", Status: &st}
		for _, p := range st.Pods["batch"] {
			r.Pods = append(r.Pods, NodePod{AgentPod: p, State: stateRunning})
		}
		if err := writeNode(io.Discard, &r, testNow); err != nil {
			t.Fatal(err)
		}
	})
}
