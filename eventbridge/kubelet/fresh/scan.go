package fresh

import (
	"google.golang.org/protobuf/encoding/protowire"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet"
)

// eventHead is what the hooks read of an event on its way to a subscriber, without decoding it.
type eventHead struct {
	// id, typ and createdAt are the event's container_id (1), container_event_type (2) and
	// created_at (3).
	id        string
	typ       runtimeapi.ContainerEventType
	createdAt int64
	// sandbox is its pod_sandbox_status's id (4), containers its containers_statuses' ids (5), read
	// only when asked for.
	sandbox    string
	containers []string
}

// scanEvent reads an encoded ContainerEventResponse's head, and with pod its pod's ids, as a decoder
// reads them (a field given twice: the last; a message field given twice: merged), skipping
// everything else; ok false when the bytes are not a message.
func scanEvent(b []byte, pod bool) (h eventHead, ok bool) {
	for len(b) > 0 {
		num, wt, n := protowire.ConsumeTag(b)
		if n < 0 {
			return eventHead{}, false
		}
		b = b[n:]
		switch {
		case num == 1 && wt == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return eventHead{}, false
			}
			h.id, b = string(v), b[n:]
			continue
		case (num == 2 || num == 3) && wt == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return eventHead{}, false
			}
			if num == 2 {
				h.typ = runtimeapi.ContainerEventType(v)
			} else {
				h.createdAt = int64(v)
			}
			b = b[n:]
			continue
		case pod && (num == 4 || num == 5) && wt == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return eventHead{}, false
			}
			b = b[n:]
			if id, found := kubelet.MessageID(v); num == 4 && found {
				h.sandbox = id
			} else if num == 5 && id != "" {
				h.containers = append(h.containers, id)
			}
			continue
		}
		if n = protowire.ConsumeFieldValue(num, wt, b); n < 0 {
			return eventHead{}, false
		}
		b = b[n:]
	}
	return h, true
}
