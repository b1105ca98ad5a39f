package podsource

import (
	"context"
	"errors"
	"fmt"

	policyv1 "k8s.io/api/policy/v1"
)

// ErrInvalidEviction is returned, without contacting the API server, for an
// Eviction without a namespace or name (it would address another URL).
var ErrInvalidEviction = errors.New("invalid eviction")

// EvictV1 POSTs eviction (policy/v1) to the pods/eviction subresource of the
// pod eviction.Namespace/eviction.Name, like client-go's typed
// PodInterface.EvictV1 but with the namespace taken from the object. The API
// server checks the pod's PodDisruptionBudgets: a refusal is a 429 error
// (apierrors.IsTooManyRequests). It needs RBAC "create" on pods/eviction.
//
// Trap: the API server sends a PDB refusal as 429 with Retry-After, which client-go's
// REST client retries by itself (up to 10 times) until the context ends, so a refusal
// would surface as a deadline error. The request is made with no retries: the evictor
// moves on to the next candidate and backs the refused pod off itself.
func (c *CoreClient) EvictV1(ctx context.Context, eviction *policyv1.Eviction) error {
	if eviction == nil || eviction.Namespace == "" || eviction.Name == "" {
		return fmt.Errorf("eviction needs a namespace and a pod name: %w", ErrInvalidEviction)
	}
	return c.rc.Post().Namespace(eviction.Namespace).Resource("pods").Name(eviction.Name).
		SubResource("eviction").MaxRetries(0).Body(eviction).Do(ctx).Error()
}
