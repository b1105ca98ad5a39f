package runqlat

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fakeReader serves fixed histograms, or an error.
type fakeReader struct {
	mu    sync.Mutex
	hists map[uint64]Histogram
	err   error
}

func (f *fakeReader) Read(dst map[uint64]Histogram) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(dst)
	if f.err != nil {
		return f.err
	}
	for k, h := range f.hists {
		dst[k] = h
	}
	return nil
}

var _ Reader = (*fakeReader)(nil)

// goldenHeader and goldenDB/goldenWeb are the exposition of the histograms
// in TestCollector, goldenBatch and goldenBatchDB/goldenBatchWeb of their
// batch's slow delays.
const goldenBatch = `# HELP understory_ls_runqueue_batch_delays_total Run-queue delays of the tasks of latency-sensitive pods at or above the slow-event threshold that ended by taking the CPU from a batch task (with classic tracepoints: all of them).
# TYPE understory_ls_runqueue_batch_delays_total counter
`

const goldenHeader = `# HELP understory_ls_runqueue_delay_seconds Run-queue delay of the tasks of latency-sensitive pods: from wakeup or preemption until running again, measured in the kernel (eBPF), in log2 buckets.
# TYPE understory_ls_runqueue_delay_seconds histogram
`

const goldenDB = `
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="db",le="2e-06"} 0
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="db",le="4e-06"} 0
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="db",le="8e-06"} 0
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="db",le="1.6e-05"} 0
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="db",le="3.2e-05"} 0
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="db",le="6.4e-05"} 0
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="db",le="0.000128"} 0
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="db",le="0.000256"} 0
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="db",le="0.000512"} 0
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="db",le="0.001024"} 0
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="db",le="0.002048"} 0
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="db",le="0.004096"} 0
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="db",le="0.008192"} 0
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="db",le="0.016384"} 0
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="db",le="0.032768"} 0
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="db",le="0.065536"} 0
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="db",le="0.131072"} 0
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="db",le="0.262144"} 0
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="db",le="0.524288"} 0
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="db",le="1.048576"} 0
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="db",le="2.097152"} 0
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="db",le="4.194304"} 0
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="db",le="8.388608"} 0
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="db",le="16.777216"} 0
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="db",le="33.554432"} 0
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="db",le="+Inf"} 1
understory_ls_runqueue_delay_seconds_sum{namespace="shop",pod="db"} 40
understory_ls_runqueue_delay_seconds_count{namespace="shop",pod="db"} 1
`

const goldenWeb = `
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="web",le="2e-06"} 3
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="web",le="4e-06"} 3
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="web",le="8e-06"} 3
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="web",le="1.6e-05"} 6
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="web",le="3.2e-05"} 6
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="web",le="6.4e-05"} 6
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="web",le="0.000128"} 6
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="web",le="0.000256"} 6
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="web",le="0.000512"} 6
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="web",le="0.001024"} 6
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="web",le="0.002048"} 7
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="web",le="0.004096"} 7
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="web",le="0.008192"} 7
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="web",le="0.016384"} 7
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="web",le="0.032768"} 7
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="web",le="0.065536"} 7
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="web",le="0.131072"} 7
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="web",le="0.262144"} 7
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="web",le="0.524288"} 7
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="web",le="1.048576"} 7
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="web",le="2.097152"} 7
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="web",le="4.194304"} 7
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="web",le="8.388608"} 7
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="web",le="16.777216"} 7
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="web",le="33.554432"} 7
understory_ls_runqueue_delay_seconds_bucket{namespace="shop",pod="web",le="+Inf"} 7
understory_ls_runqueue_delay_seconds_sum{namespace="shop",pod="web"} 0.002
understory_ls_runqueue_delay_seconds_count{namespace="shop",pod="web"} 7
`

const (
	goldenBatchDB  = "understory_ls_runqueue_batch_delays_total{namespace=\"shop\",pod=\"db\"} 1\n"
	goldenBatchWeb = "understory_ls_runqueue_batch_delays_total{namespace=\"shop\",pod=\"web\"} 1\n"
)

func TestCollector(t *testing.T) {
	t.Parallel()
	web := Histogram{Count: 5, SumNs: 1_500_000} // Count lags the buckets: a read mid-update
	web.Buckets[0], web.Buckets[3], web.Buckets[10] = 3, 2, 1
	web.Batch = 1
	webSidecar := Histogram{Count: 1, SumNs: 500_000}
	webSidecar.Buckets[3] = 1
	db := Histogram{Count: 1, SumNs: 40_000_000_000, Batch: 1}
	db.Buckets[NumBuckets-1] = 1
	unlabelled := Histogram{Count: 9}
	unlabelled.Buckets[0] = 9

	r := &fakeReader{hists: map[uint64]Histogram{100: web, 101: webSidecar, 200: db, 300: unlabelled}}
	c := NewCollector(r)
	c.Label(100, "shop", "web")
	c.Label(101, "shop", "web") // two keys of one pod are summed
	c.Label(200, "shop", "db")
	c.Label(400, "shop", "gone") // labelled but not read: not exported

	if err := testutil.CollectAndCompare(c, strings.NewReader(goldenBatch+goldenBatchDB+goldenBatchWeb+goldenHeader+goldenDB+goldenWeb)); err != nil {
		t.Error(err)
	}
	c.Forget(200)
	if err := testutil.CollectAndCompare(c, strings.NewReader(goldenBatch+goldenBatchWeb+goldenHeader+goldenWeb)); err != nil {
		t.Errorf("after Forget: %v", err)
	}
}

func TestCollectorReadError(t *testing.T) {
	t.Parallel()
	c := NewCollector(&fakeReader{err: errors.New("map gone")})
	c.Label(1, "ns", "pod")
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	// client_golang reports the invalid metric's error as text (no %w).
	mfs, err := reg.Gather()
	if err == nil || len(mfs) != 0 {
		t.Errorf("Gather() = %v, %v; want the reader's error and no metrics", mfs, err)
	}
}
