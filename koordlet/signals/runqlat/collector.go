package runqlat

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Reader is where the Collector gets histograms: a *Probe.
type Reader interface {
	// Read replaces dst's contents with the cumulative histogram per key.
	Read(dst map[uint64]Histogram) error
}

var _ Reader = (*Probe)(nil)

// Collector exports the histograms of a Reader as
// understory_ls_runqueue_delay_seconds{namespace,pod}, and their Batch as
// understory_ls_runqueue_batch_delays_total{namespace,pod}. Only keys given a
// pod with Label are exported; keys labelled with the same pod are summed.
// Safe for concurrent use; register it on a prometheus.Registry.
type Collector struct {
	r     Reader
	desc  *prometheus.Desc
	batch *prometheus.Desc

	mu      sync.Mutex
	pods    map[uint64]podName
	scratch map[uint64]Histogram
	sums    map[podName]Histogram
}

type podName struct{ namespace, pod string }

var _ prometheus.Collector = (*Collector)(nil)

// NewCollector returns a collector reading r on every scrape.
func NewCollector(r Reader) *Collector {
	return &Collector{
		r: r,
		desc: prometheus.NewDesc("understory_ls_runqueue_delay_seconds",
			"Run-queue delay of the tasks of latency-sensitive pods: from wakeup or preemption "+
				"until running again, measured in the kernel (eBPF), in log2 buckets.",
			[]string{"namespace", "pod"}, nil),
		batch: prometheus.NewDesc("understory_ls_runqueue_batch_delays_total",
			"Run-queue delays of the tasks of latency-sensitive pods at or above the slow-event "+
				"threshold that ended by taking the CPU from a batch task (with classic tracepoints: all of them).",
			[]string{"namespace", "pod"}, nil),
		pods:    map[uint64]podName{},
		scratch: map[uint64]Histogram{},
		sums:    map[podName]Histogram{},
	}
}

// Label names the pod whose histogram key (the id passed to Probe.Watch) is
// id.
func (c *Collector) Label(id uint64, namespace, pod string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pods[id] = podName{namespace, pod}
}

// Forget drops id's label: it is no longer exported.
func (c *Collector) Forget(id uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pods, id)
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.desc
	ch <- c.batch
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.r.Read(c.scratch); err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		ch <- prometheus.NewInvalidMetric(c.batch, err)
		return
	}
	clear(c.sums)
	for id, h := range c.scratch {
		if name, ok := c.pods[id]; ok {
			c.sums[name] = c.sums[name].add(h)
		}
	}
	for name, h := range c.sums {
		// Cumulative counts per finite upper bound; the last bucket is +Inf,
		// which Prometheus takes from the count. The count is the buckets'
		// sum (see Histogram) so that +Inf is never below a finite bucket.
		buckets := make(map[float64]uint64, NumBuckets-1)
		var cum uint64
		for i := range NumBuckets - 1 {
			cum += h.Buckets[i]
			buckets[BucketUpper(i).Seconds()] = cum
		}
		m, err := prometheus.NewConstHistogram(c.desc, cum+h.Buckets[NumBuckets-1], float64(h.SumNs)/1e9,
			buckets, name.namespace, name.pod)
		if err != nil {
			m = prometheus.NewInvalidMetric(c.desc, err)
		}
		ch <- m
		ch <- prometheus.MustNewConstMetric(c.batch, prometheus.CounterValue, float64(h.Batch),
			name.namespace, name.pod)
	}
}
