package koordlet

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/contract"
	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/koordlet/nodestatus"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// recordingSink is a node-metrics sink that keeps what it was given and fails while
// fail is set.
type recordingSink struct {
	mu      sync.Mutex
	fail    bool
	written []contract.NodeMetrics
	tries   int
}

var _ nodeMetricsPublisher = (*recordingSink)(nil)

var errSinkDown = errors.New("API server unreachable")

func (s *recordingSink) Publish(_ context.Context, m contract.NodeMetrics) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tries++
	if s.fail {
		return errSinkDown
	}
	s.written = append(s.written, m)
	return nil
}

func (s *recordingSink) setFail(v bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = v
}

func (s *recordingSink) counts() (tries, written int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tries, len(s.written)
}

// TestAgentWritesNodeMetricsOnChange drives the agent through windows of steady load,
// an LS rise and an API outage, and checks each window is written exactly when the
// report policy says: the first, a heartbeat every maxInterval while nothing moves, at
// once on a material change, and every window after a failed write until one lands.
func TestAgentWritesNodeMetricsOnChange(t *testing.T) {
	t.Parallel()
	sink := &recordingSink{}
	r := newRigWith(t, cgroupstest.V2, func(c *config.Config) {
		c.NodeName = "n1"
		c.NodeMetricsPeriod.Duration = time.Second
		c.NodeMetricsReport = qos.ReportPolicy{Change: 0.05}
		c.NodeMetricsReport.MaxInterval.Duration = 5 * time.Second
	}, sink)
	perWindow := int(time.Second / r.period)
	// window runs one node-metrics window (its last period closes it) at the given LS
	// cores (batch steady at 1 core), waits for its publish, and returns how many
	// documents the sink holds.
	window := func(ls float64) int {
		t.Helper()
		for range perWindow {
			r.step(ls+1.1, map[string]float64{r.lsCg: ls, r.inPlace: 0.5, r.inTier: 0.5})
		}
		r.agent.publish.wait()
		_, n := sink.counts()
		return n
	}
	writes := func(reason qos.ReportReason) float64 {
		return testutil.ToFloat64(r.agent.metrics.NodeMetricsWrites.WithLabelValues(string(reason)))
	}
	// The first tick only reads (rates need two samples); windows start at the second.
	r.step(0, nil)
	r.step(1.5, map[string]float64{r.lsCg: 0.4, r.inPlace: 0.5, r.inTier: 0.5})
	// Settle: the first window is written; the in-place batch pod is sampled every
	// slowEvery periods, so the second may still differ by more than 5 %.
	window(0.4)
	window(0.4)
	_, settled := sink.counts()
	if settled < 1 || writes(qos.ReportFirst) != 1 {
		t.Fatalf("after two windows: %d documents, %v first writes; want the first written", settled,
			writes(qos.ReportFirst))
	}
	// Steady: nothing until the heartbeat, 5 s after the last write.
	var steady []int
	for range 6 {
		steady = append(steady, window(0.4))
	}
	if got := steady[len(steady)-1] - settled; got != 1 || writes(qos.ReportHeartbeat) != 1 {
		t.Fatalf("six steady windows after %d documents: counts %v, %v heartbeats; want exactly one heartbeat write",
			settled, steady, writes(qos.ReportHeartbeat))
	}
	// LS rises by 0.4 of 2 cores (20 %): written in that window.
	before := steady[len(steady)-1]
	if got := window(0.8); got != before+1 || writes(qos.ReportCPU) < 1 {
		t.Fatalf("LS rise: %d documents after %d, %v cpu writes; want one more at once", got, before,
			writes(qos.ReportCPU))
	}
	sink.mu.Lock()
	last := sink.written[len(sink.written)-1]
	sink.mu.Unlock()
	if last.CPU.LS < 790 || last.CPU.LS > 810 {
		t.Fatalf("written after the rise: ls %d, want 800", last.CPU.LS)
	}
	// The API server goes away just as LS falls: the failed write is retried every
	// window, and once one lands the next steady window writes nothing.
	sink.setFail(true)
	tries0, written0 := sink.counts()
	window(0.4)
	window(0.4)
	tries1, _ := sink.counts()
	if tries1-tries0 != 2 {
		t.Fatalf("during the outage: %d attempts in two windows, want 2 (the change, then its retry)", tries1-tries0)
	}
	sink.setFail(false)
	if got := window(0.4); got != written0+1 || writes(qos.ReportRetry) != 1 {
		t.Fatalf("after the outage: %d documents, want %d; %v retry writes, want 1", got, written0+1,
			writes(qos.ReportRetry))
	}
	if got := window(0.4); got != written0+1 {
		t.Fatalf("a steady window after the retry wrote again: %d documents, want %d", got, written0+1)
	}
}

func TestNodeMetricsReasonsMatchReportReasons(t *testing.T) {
	t.Parallel()
	var want []string
	for _, r := range qos.ReportReasons() {
		want = append(want, string(r))
	}
	if got := metrics.NodeMetricsReasons(); !slices.Equal(got, want) {
		t.Fatalf("metrics.NodeMetricsReasons() = %v, qos.ReportReasons() = %v", got, want)
	}
}

// TestAgentPublishesWindowMeans drives the agent over one node-metrics window and
// checks the annotation holds the window's mean usage and budget.
func TestAgentPublishesWindowMeans(t *testing.T) {
	t.Parallel()
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	r := newRigWith(t, cgroupstest.V2, func(c *config.Config) {
		c.NodeName = "n1"
		c.NodeMetricsPeriod.Duration = time.Second
		c.NodeMetricsReport.Change = 0 // every window: this test reads the last one's means
	}, nodestatus.NewNodeAnnotator(client.CoreV1().Nodes(), "n1"))
	r.step(0, nil)
	// Two windows: batch pods held in place are sampled every slowEvery periods, so the
	// first window starts before their first rate.
	// Each publish is waited for: the publisher skips a window while the previous
	// publish is still in flight, which on a loaded machine left the first window's
	// figures in the annotation.
	for range 2*slowEvery + 5 {
		r.step(1.5, map[string]float64{r.lsCg: 0.4, r.inPlace: 0.5, r.inTier: 0.5})
		r.agent.publish.wait()
	}
	n, err := client.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := contract.DecodeNodeMetrics(n.Annotations[contract.AnnotationNodeMetrics])
	if err != nil {
		t.Fatalf("annotation %q: %v", n.Annotations[contract.AnnotationNodeMetrics], err)
	}
	if m.CPU.Capacity != 2000 || m.CPU.LS < 390 || m.CPU.LS > 410 || m.CPU.Used < 1490 || m.CPU.Used > 1510 ||
		m.CPU.Batch < 990 || m.CPU.Batch > 1010 || m.CPU.BatchBudget <= 0 || m.WindowMillis < 1000 {
		t.Fatalf("node metrics %+v: want cap 2000, used 1500, ls 400, batch 1000 over ≥ 1 s", m)
	}
}
