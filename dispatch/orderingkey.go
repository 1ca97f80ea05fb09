package dispatch

import (
	"crypto/sha256"
	"encoding/hex"
)

// OrderingKey is the aggregate as one string, "<aggregate_type>/<aggregate_id>",
// for destinations whose ordering key is scoped by a topic or stream that
// several aggregate types may share (Pub/Sub ordering key, Kinesis
// partition key). Longer than maxBytes, it is "sha256:" and the hex digest
// of that string: still one key per aggregate, so its order is kept, within
// the destination's limit. maxBytes must be at least 71.
func OrderingKey(ev Event, maxBytes int) string {
	k := ev.AggregateType + "/" + ev.AggregateID
	if len(k) <= maxBytes {
		return k
	}
	sum := sha256.Sum256([]byte(k))
	return "sha256:" + hex.EncodeToString(sum[:])
}
