package clusterbench

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/understory/understory/contract"
)

// podState is what the tracker knows of one batch pod.
type podState struct {
	submitted, bound, running, done time.Time
	node                            int
	counted                         bool // its requests are in used[node]
	checked                         bool // its form was checked (converted)
	cpu, mem, gpu                   int64
	// job is the namespace/name of the Job that created it (Kueue mode), gang its
	// gang's size (1: not a gang).
	job  string
	gang int
	// gone: deleted before it completed (Kueue evicted its Workload); deleting:
	// its delete is queued.
	gone, deleting bool
}

// jobTrackingFinalizer is the Job controller's finalizer on the pods it creates:
// it removes it once it has counted the finished pod; deleting the pod before
// that would lose the count.
const jobTrackingFinalizer = "batch.kubernetes.io/job-tracking"

// podKey is the tracker's key of a pod (or a Job): namespace/name.
func podKey(ns, name string) string { return ns + "/" + name }

// tracker follows the batch pods: when each was submitted, bound and completed, and
// what the pods bound to each node hold (used, read by the agent stand-in).
type tracker struct {
	client     kubernetes.Interface
	namespaces []string
	index      map[string]int
	used       []usage
	mu         sync.Mutex
	// pods by podKey; jobs: each Job (podKey) the benchmark created (Kueue mode).
	pods    map[string]*podState
	jobs    map[string]jobState
	deletes chan [2]string
	// unconverted counts the batch pods seen without batch resources (created
	// with cpu or memory: the webhook did not convert them).
	unconverted int
}

// newTracker follows the batch pods of namespaces (nsBatch; with Kueue, the
// tenants' namespaces).
func newTracker(c kubernetes.Interface, nodes []benchNode, used []usage, namespaces ...string) *tracker {
	t := &tracker{client: c, namespaces: namespaces, index: map[string]int{}, used: used, pods: map[string]*podState{},
		jobs: map[string]jobState{}, deletes: make(chan [2]string, 1<<16)}
	for i, n := range nodes {
		t.index[n.name] = i
	}
	return t
}

// submitted records when the benchmark created pod ns/name.
func (t *tracker) submitted(ns, name string, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := podKey(ns, name)
	if p := t.pods[k]; p != nil {
		if p.submitted.IsZero() {
			p.submitted = at
		}
		return
	}
	t.pods[k] = &podState{submitted: at, node: -1}
}

// jobState is what the tracker knows of one Job (Kueue mode): when the benchmark
// created it and how many pods it runs.
type jobState struct {
	submitted time.Time
	members   int
}

// jobSubmitted records when the benchmark created Job ns/name of members pods:
// its pods count as submitted then, whether or not they exist yet (the Job
// controller creates them once Kueue admits the Job), and their wait includes
// Kueue's.
func (t *tracker) jobSubmitted(ns, name string, members int, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.jobs[podKey(ns, name)] = jobState{submitted: at, members: max(members, 1)}
}

// run watches the batch namespaces until ctx ends and deletes completed pods (with
// 4 workers), so the API server's pod count stays what is live.
func (t *tracker) run(ctx context.Context) error {
	for _, ns := range t.namespaces {
		f := informers.NewSharedInformerFactoryWithOptions(t.client, 0, informers.WithNamespace(ns))
		inf := f.Core().V1().Pods().Informer()
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { t.observe(o) },
			UpdateFunc: func(_, o any) { t.observe(o) },
			DeleteFunc: func(o any) { t.deleted(o) },
		}); err != nil {
			return fmt.Errorf("pod handler: %w", err)
		}
		f.Start(ctx.Done())
		if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			return fmt.Errorf("pod informer of %s: %w", ns, ctx.Err())
		}
	}
	zero := int64(0)
	for range 4 {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case k := <-t.deletes:
					_ = t.client.CoreV1().Pods(k[0]).Delete(ctx, k[1], metav1.DeleteOptions{GracePeriodSeconds: &zero})
				}
			}
		}()
	}
	return nil
}

// deleted handles a pod gone from the API: one deleted before it completed (its
// Job suspended by Kueue) no longer holds its node's resources.
func (t *tracker) deleted(o any) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	pod, ok := o.(*corev1.Pod)
	if !ok {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.pods[podKey(pod.Namespace, pod.Name)]
	if p == nil || !p.done.IsZero() {
		return
	}
	p.gone = true
	t.uncount(p)
}

// boundCPUMilli is the batch-cpu the bound, unfinished batch pods hold, summed
// over the nodes.
func (t *tracker) boundCPUMilli() int64 {
	var n int64
	for i := range t.used {
		n += t.used[i].cpuMilli.Load()
	}
	return n
}

// uncount takes p's requests off its node (t.mu held).
func (t *tracker) uncount(p *podState) {
	if !p.counted {
		return
	}
	u := &t.used[p.node]
	u.cpuMilli.Add(-p.cpu)
	u.memBytes.Add(-p.mem)
	u.gpuMilli.Add(-p.gpu)
	p.counted = false
}

func (t *tracker) observe(o any) {
	pod, ok := o.(*corev1.Pod)
	if !ok {
		return
	}
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	k := podKey(pod.Namespace, pod.Name)
	p := t.pods[k]
	if p == nil {
		p = &podState{node: -1, gang: 1}
		t.pods[k] = p
	}
	if job := pod.Labels[labelJobName]; job != "" && p.job == "" {
		p.job = podKey(pod.Namespace, job)
		if j, ok := t.jobs[p.job]; ok && p.submitted.IsZero() {
			p.submitted = j.submitted
		}
		if n, err := strconv.Atoi(pod.Annotations[contract.AnnotationKoordinatorMinAvailable]); err == nil && n > 1 {
			p.gang = n
		}
	}
	if !p.checked {
		p.checked = true
		if !converted(pod) {
			t.unconverted++
		}
	}
	if pod.Spec.NodeName != "" && p.bound.IsZero() {
		p.bound = now
		if i, ok := t.index[pod.Spec.NodeName]; ok {
			p.node = i
			req := pod.Spec.Containers[0].Resources.Requests
			p.cpu = quantity(req, contract.ResourceBatchCPU)
			p.mem = quantity(req, contract.ResourceBatchMemory)
			p.gpu = quantity(req, contract.ResourceGPU)*contract.MilliPerGPU + quantity(req, contract.ResourceGPUMilli)
			u := &t.used[i]
			u.cpuMilli.Add(p.cpu)
			u.memBytes.Add(p.mem)
			u.gpuMilli.Add(p.gpu)
			p.counted = true
		}
	}
	if pod.Status.Phase == corev1.PodRunning && p.running.IsZero() {
		p.running = now
	}
	if (pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed) && p.done.IsZero() {
		p.done = now
		t.uncount(p)
	}
	// A Job's pod is deleted once the Job controller has counted it (its
	// finalizer removed).
	if !p.done.IsZero() && !p.deleting && !slices.Contains(pod.Finalizers, jobTrackingFinalizer) {
		select {
		case t.deletes <- [2]string{pod.Namespace, pod.Name}:
			p.deleting = true
		default:
		}
	}
}

// jobPods is what the tracker has seen of one Job's pods, those deleted unfinished
// left out: pods seen, not yet bound, bound and not finished, finished.
type jobPods struct{ pods, unbound, live, done int }

// podsByJob counts the pods of each Job (podKey of the Job) it has seen.
func (t *tracker) podsByJob() map[string]jobPods {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]jobPods{}
	for _, p := range t.pods {
		if p.job == "" || p.gone {
			continue
		}
		c := out[p.job]
		c.pods++
		switch {
		case !p.done.IsZero():
			c.done++
		case p.bound.IsZero():
			c.unbound++
		default:
			c.live++
		}
		out[p.job] = c
	}
	return out
}

// partialGangs counts the gang Jobs with some but not all of their pods bound:
// pods bound and not finished, while the Job's bound-or-finished pods are fewer
// than the gang (pods deleted unfinished, by an eviction, do not count).
func (t *tracker) partialGangs() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	type count struct{ live, placed, gang int }
	jobs := map[string]*count{}
	for _, p := range t.pods {
		if p.job == "" || p.gang < 2 || p.gone {
			continue
		}
		c := jobs[p.job]
		if c == nil {
			c = &count{gang: p.gang}
			jobs[p.job] = c
		}
		if !p.bound.IsZero() {
			c.placed++
			if p.done.IsZero() {
				c.live++
			}
		}
	}
	n := 0
	for _, c := range jobs {
		if c.live > 0 && c.placed < c.gang {
			n++
		}
	}
	return n
}

func quantity(l corev1.ResourceList, name corev1.ResourceName) int64 {
	q, ok := l[name]
	if !ok {
		return 0
	}
	return q.Value()
}

// podStats are the batch pods' figures over the window [from, to].
type podStats struct {
	// Submitted: pods created in the window; Bound, Running, Completed: pods bound,
	// seen Running, Succeeded in the window, whenever submitted; StillPending: pods
	// submitted before to and not bound by then. A Job's pods (Kueue mode) count
	// from the Job: submitted with it, pending while fewer of its pods than its
	// members are bound (an evicted pod, deleted unfinished, no longer counts).
	Submitted, Bound, Running, Completed, StillPending int
	// QueueP50 and QueueP99: seconds from submission to bind of the pods bound in
	// the window.
	QueueP50, QueueP99 float64
	// BindToRunP50 is kwok's lag from bind to Running, seconds.
	BindToRunP50    float64
	PeakBindsPer10s int
	// Unconverted: batch pods seen (in the whole run) that the webhook did not
	// convert to batch resources.
	Unconverted int
}

func (t *tracker) stats(from, to time.Time) podStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	var s podStats
	var waits, lags []float64
	bins := map[int64]int{}
	in := func(at time.Time) bool { return !at.IsZero() && !at.Before(from) && !at.After(to) }
	// A Job's pods are counted submitted and pending through the Job: its pods may
	// not exist yet, or exist more than once (evicted and created again).
	jobBound := map[string]int{}
	for _, p := range t.pods {
		if p.submitted.IsZero() {
			continue
		}
		if _, ok := t.jobs[p.job]; ok {
			if !p.bound.IsZero() && !p.bound.After(to) && !p.gone {
				jobBound[p.job]++
			}
		} else {
			if in(p.submitted) {
				s.Submitted++
			}
			if !p.submitted.After(to) && (p.bound.IsZero() || p.bound.After(to)) {
				s.StillPending++
			}
		}
		if in(p.bound) {
			s.Bound++
			waits = append(waits, p.bound.Sub(p.submitted).Seconds())
			bins[p.bound.Sub(from).Milliseconds()/10000]++
		}
		if in(p.running) && !p.bound.IsZero() {
			s.Running++
			lags = append(lags, p.running.Sub(p.bound).Seconds())
		}
		if in(p.done) {
			s.Completed++
		}
	}
	for k, j := range t.jobs {
		if in(j.submitted) {
			s.Submitted += j.members
		}
		if !j.submitted.After(to) {
			s.StillPending += max(j.members-jobBound[k], 0)
		}
	}
	s.QueueP50, s.QueueP99 = quantile(waits, 0.5), quantile(waits, 0.99)
	s.BindToRunP50 = quantile(lags, 0.5)
	s.Unconverted = t.unconverted
	for _, v := range bins {
		s.PeakBindsPer10s = max(s.PeakBindsPer10s, v)
	}
	return s
}

// quantile is the q-quantile of v (nearest rank); 0 for none.
func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	i := int(math.Ceil(q*float64(len(v)))) - 1
	return v[min(max(i, 0), len(v)-1)]
}

// scrape reads a Prometheus text endpoint.
func scrape(ctx context.Context, get func(ctx context.Context) (io.ReadCloser, error)) (map[string]*dto.MetricFamily, error) {
	rc, err := get(ctx)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(rc)
	if err != nil {
		return nil, fmt.Errorf("parsing metrics: %w", err)
	}
	return fams, nil
}

func httpGetter(url string) func(ctx context.Context) (io.ReadCloser, error) {
	return httpGetterWith(http.DefaultClient, url)
}

// httpGetterWith is httpGetter through hc.
func httpGetterWith(hc *http.Client, url string) func(ctx context.Context) (io.ReadCloser, error) {
	return func(ctx context.Context) (io.ReadCloser, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return nil, fmt.Errorf("metrics request: %w", err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return nil, fmt.Errorf("scraping %s: %w", url, err)
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			return nil, fmt.Errorf("scraping %s: %s: %w", url, resp.Status, errScrape)
		}
		return resp.Body, nil
	}
}

// RequestRate is the API server's request rate of one verb on one resource.
type RequestRate struct {
	Verb        string  `json:"verb"`
	Resource    string  `json:"resource"`
	Subresource string  `json:"subresource,omitempty"`
	PerSec      float64 `json:"per_sec"`
}

// requestRates diffs apiserver_request_total between two scrapes, per verb,
// resource and subresource (codes and scopes summed), over secs; highest first.
func requestRates(before, after map[string]*dto.MetricFamily, secs float64) []RequestRate {
	sum := func(fams map[string]*dto.MetricFamily) map[[3]string]float64 {
		out := map[[3]string]float64{}
		f := fams["apiserver_request_total"]
		if f == nil {
			return out
		}
		for _, m := range f.GetMetric() {
			var k [3]string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "verb":
					k[0] = l.GetValue()
				case "resource":
					k[1] = l.GetValue()
				case "subresource":
					k[2] = l.GetValue()
				}
			}
			out[k] += m.GetCounter().GetValue()
		}
		return out
	}
	b, a := sum(before), sum(after)
	var out []RequestRate
	for k, v := range a {
		if d := v - b[k]; d > 0 && k[1] != "" {
			out = append(out, RequestRate{Verb: k[0], Resource: k[1], Subresource: k[2], PerSec: d / secs})
		}
	}
	slices.SortFunc(out, func(x, y RequestRate) int {
		if c := -cmpFloat(x.PerSec, y.PerSec); c != 0 {
			return c
		}
		return strings.Compare(x.Verb+x.Resource+x.Subresource, y.Verb+y.Resource+y.Subresource)
	})
	return out
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// histogramQuantile is Prometheus' histogram_quantile over the difference of the
// histogram samples labelled verb=<verb> between two scrapes: linear interpolation
// within the bucket; the largest finite bound when q falls in +Inf. It returns the
// count too; NaN without observations.
func histogramQuantile(before, after map[string]*dto.MetricFamily, name, verb string, q float64) (float64, uint64) {
	return histogramQuantileBy(before, after, name, "verb", verb, q)
}

// histogramQuantileBy is histogramQuantile over the samples labelled label=value
// (summed when several match; every sample when label is empty).
func histogramQuantileBy(before, after map[string]*dto.MetricFamily, name, label, value string, q float64) (float64, uint64) {
	buckets := func(fams map[string]*dto.MetricFamily) (map[float64]uint64, uint64) {
		out := map[float64]uint64{}
		var n uint64
		f := fams[name]
		if f == nil {
			return out, 0
		}
		for _, m := range f.GetMetric() {
			match := label == ""
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					match = true
				}
			}
			if !match || m.GetHistogram() == nil {
				continue
			}
			for _, b := range m.GetHistogram().GetBucket() {
				out[b.GetUpperBound()] += b.GetCumulativeCount()
			}
			n += m.GetHistogram().GetSampleCount()
		}
		return out, n
	}
	b, nb := buckets(before)
	a, na := buckets(after)
	n := na - nb
	if n == 0 {
		return math.NaN(), 0
	}
	var bounds []float64
	for ub := range a {
		bounds = append(bounds, ub)
	}
	slices.Sort(bounds)
	rank := q * float64(n)
	prevUB, prevC := 0.0, 0.0
	for _, ub := range bounds {
		c := float64(a[ub] - b[ub])
		if c >= rank {
			if math.IsInf(ub, 1) {
				return prevUB, n
			}
			if c == prevC {
				return ub, n
			}
			return prevUB + (ub-prevUB)*(rank-prevC)/(c-prevC), n
		}
		prevUB, prevC = ub, c
	}
	return prevUB, n
}

// counterValue sums the counter or gauge family name.
func counterValue(fams map[string]*dto.MetricFamily, name string) float64 {
	f := fams[name]
	if f == nil {
		return 0
	}
	s := 0.0
	for _, m := range f.GetMetric() {
		s += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return s
}

func itoa(i int) string { return strconv.Itoa(i) }
