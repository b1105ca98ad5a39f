package extenderbench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/understory/understory/contract"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	extender "github.com/understory/understory/scheduler-extender"
)

// LockHold is the write-lock hold measurement: every hold of the index's
// write lock (extender.Deps.LockHold) while a gang of GangMembers members
// that cannot fit now waits on Nodes nodes (a member is filtered every 10 ms:
// each filter plans the gang again, since the index keeps changing), plain
// filters run from two clients and informer events add and delete bound pods.
type LockHold struct {
	Date        time.Time `json:"date"`
	Machine     Machine   `json:"machine"`
	Nodes       int       `json:"nodes"`
	GangMembers int       `json:"gang_members"`
	Seconds     float64   `json:"seconds"`
	// Holds is how many write-lock holds were measured.
	Holds  int     `json:"holds"`
	P50Ms  float64 `json:"p50_ms"`
	P99Ms  float64 `json:"p99_ms"`
	P999Ms float64 `json:"p999_ms"`
	MaxMs  float64 `json:"max_ms"`
	// GangFilters is how many filters of gang members were answered; GangPlans
	// how many of them were answered "K/M members fit" (planned, or from the
	// cached plan; the others were told another member is planning); GangReason
	// the last such answer.
	GangFilters int64  `json:"gang_filters"`
	GangPlans   int64  `json:"gang_plans"`
	GangReason  string `json:"gang_reason"`
	// PlainFilters and PlainFilterP99Ms are the plain pods' filters meanwhile.
	PlainFilters     int     `json:"plain_filters"`
	PlainFilterP99Ms float64 `json:"plain_filter_p99_ms"`
	// InformerEvents is how many bound pods were added or deleted meanwhile.
	InformerEvents int64   `json:"informer_events"`
	TargetP99Ms    float64 `json:"target_p99_ms"`
	Pass           bool    `json:"pass"`
}

// gangMember is member i of a Volcano gang of n members asking for 8 GPUs
// each: on the openb mix it fits the empty cluster, not the loaded one.
func gangMember(i, n int) *corev1.Pod {
	name := fmt.Sprintf("gang-%04d", i)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name, UID: types.UID("uid-" + name),
			CreationTimestamp: metav1.NewTime(time.Unix(int64(i), 0)),
			Annotations: map[string]string{contract.AnnotationVolcanoGroupName: "huge",
				contract.AnnotationVolcanoMinMember: fmt.Sprint(n)}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8")},
			Limits:   corev1.ResourceList{contract.ResourceGPU: *resource.NewQuantity(8, resource.DecimalSI)},
		}}}},
	}
}

func quantileMs(d []float64, p float64) float64 {
	if len(d) == 0 {
		return 0
	}
	return d[int(p*float64(len(d)-1))] * 1000
}

func runLockHold(ctx context.Context, o Options) (LockHold, error) {
	var (
		mu        sync.Mutex
		holds     []float64
		measuring atomic.Bool
	)
	obs := prometheus.ObserverFunc(func(v float64) {
		if measuring.Load() {
			mu.Lock()
			holds = append(holds, v)
			mu.Unlock()
		}
	})
	cfg := benchConfig(o)
	cfg.MaxGangMembers = max(cfg.MaxGangMembers, o.GangMembers)
	c, err := newCluster(o, cfg, extender.Deps{LockHold: obs})
	if err != nil {
		return LockHold{}, err
	}
	srv, rng, names, st := c.srv, c.rng, c.names, c.state
	for i := range o.GangMembers {
		st.UpsertPod(gangMember(i, o.GangMembers))
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return LockHold{}, err
	}
	hs := extender.NewHTTPServer(ln.Addr().String(), srv.Handler(), cfg)
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()
	url := "http://" + ln.Addr().String() + "/filter"
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}, Timeout: time.Minute}
	body := func(p *corev1.Pod) ([]byte, error) {
		return json.Marshal(extenderv1.ExtenderArgs{Pod: p, NodeNames: &names})
	}
	post := func(b []byte) (extenderv1.ExtenderFilterResult, error) {
		var res extenderv1.ExtenderFilterResult
		resp, err := client.Post(url, "application/json", bytes.NewReader(b))
		if err != nil {
			return res, err
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			return res, err
		}
		return res, json.Unmarshal(raw, &res)
	}
	gangBodies := make([][]byte, o.GangMembers)
	for i := range gangBodies {
		if gangBodies[i], err = body(gangMember(i, o.GangMembers)); err != nil {
			return LockHold{}, err
		}
	}
	template := mkPod("template", rng, "", nil)
	plainBodies := make([][]byte, 64)
	for i := range plainBodies {
		p := template.DeepCopy()
		p.Name, p.UID = fmt.Sprintf("plain-%d", i), types.UID(fmt.Sprintf("uid-plain-%d", i))
		if plainBodies[i], err = body(p); err != nil {
			return LockHold{}, err
		}
	}

	runCtx, cancel := context.WithTimeout(ctx, o.LockHoldDuration)
	defer cancel()
	measuring.Store(true)
	start := time.Now()
	var (
		wg                     sync.WaitGroup
		gangFilters, gangPlans atomic.Int64
		events                 atomic.Int64
		reasonMu               sync.Mutex
		lastReason             string
		plainMu                sync.Mutex
		plainLat               []float64
		errMu                  sync.Mutex
		firstErr               error
	)
	fail := func(err error) {
		errMu.Lock()
		defer errMu.Unlock()
		if firstErr == nil && runCtx.Err() == nil {
			firstErr = err
		}
	}
	wg.Go(func() { // the gang's members retry
		for i := 0; runCtx.Err() == nil; i++ {
			res, err := post(gangBodies[i%len(gangBodies)])
			if err != nil {
				fail(fmt.Errorf("gang filter: %w", err))
				return
			}
			gangFilters.Add(1)
			for _, r := range res.FailedNodes {
				if strings.Contains(r, "members fit") { // planned (or answered from the cached plan): waits
					gangPlans.Add(1)
					reasonMu.Lock()
					lastReason = r
					reasonMu.Unlock()
				}
				break
			}
			select {
			case <-runCtx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	})
	for c := range 2 { // plain filters
		wg.Go(func() {
			var lat []float64
			for i := c; runCtx.Err() == nil; i += 2 {
				t0 := time.Now()
				if _, err := post(plainBodies[i%len(plainBodies)]); err != nil {
					fail(fmt.Errorf("plain filter: %w", err))
					break
				}
				lat = append(lat, time.Since(t0).Seconds())
			}
			plainMu.Lock()
			plainLat = append(plainLat, lat...)
			plainMu.Unlock()
		})
	}
	wg.Go(func() { // informer events: bound pods come and go
		for k := 0; runCtx.Err() == nil; k++ {
			node := names[rng.Intn(len(names))]
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "churn", Name: fmt.Sprintf("c-%d", k),
				UID: types.UID(fmt.Sprintf("uid-c-%d", k))}, Spec: corev1.PodSpec{NodeName: node,
				Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}}}}}
			st.UpsertPod(p)
			if k >= 100 {
				st.DeletePod(types.UID(fmt.Sprintf("uid-c-%d", k-100)))
			}
			events.Add(2)
			time.Sleep(5 * time.Millisecond)
		}
	})
	wg.Wait()
	measuring.Store(false)
	elapsed := time.Since(start).Seconds()
	if firstErr != nil {
		return LockHold{}, firstErr
	}
	mu.Lock()
	h := slices.Clone(holds)
	mu.Unlock()
	slices.Sort(h)
	slices.Sort(plainLat)
	res := LockHold{Date: time.Now().UTC(), Nodes: o.Nodes, GangMembers: o.GangMembers, Seconds: elapsed,
		Holds: len(h), P50Ms: quantileMs(h, 0.5), P99Ms: quantileMs(h, 0.99), P999Ms: quantileMs(h, 0.999),
		MaxMs: quantileMs(h, 1), GangFilters: gangFilters.Load(), GangPlans: gangPlans.Load(), GangReason: lastReason,
		PlainFilters: len(plainLat), PlainFilterP99Ms: quantileMs(plainLat, 0.99), InformerEvents: events.Load(),
		TargetP99Ms: float64(o.TargetLockP99.Microseconds()) / 1000,
		Machine:     thisMachine()}
	res.Pass = res.Holds > 0 && res.P99Ms <= res.TargetP99Ms && res.GangPlans > 0
	return res, nil
}
