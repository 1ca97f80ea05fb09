package nats

import (
	"fmt"
	"net/textproto"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outboxd/dispatch"
)

// maxHeaderBlock is the largest header block JetStream stores: it keeps
// the length in 16 bits and answers a larger one with err_code 10097
// ("header size exceeds maximum allowed of 64k"), for ever. The server's
// max_payload (from its INFO, which nats.go checks at publish) bounds
// headers and payload together.
const maxHeaderBlock = 1<<16 - 1

// errCodeHeaderTooLarge is JetStream's error code for a header block above
// maxHeaderBlock (JSStreamHeaderExceedsMaximumErr).
const errCodeHeaderTooLarge jetstream.ErrorCode = 10097

// headerBlockSize is the size of h as nats.go encodes it (Msg.headerSize):
// "NATS/1.0\r\n", one "Key: Value\r\n" line per value, and "\r\n".
func headerBlockSize(h nats.Header) int {
	if len(h) == 0 {
		return 0
	}
	n := len("NATS/1.0\r\n") + len("\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(": ") + len(textproto.TrimString(v)) + len("\r\n")
		}
	}
	return n
}

// checkHeaders refuses, before publishing, a message whose header block
// JetStream can never store: Permanent, for this event only.
func checkHeaders(ev dispatch.Event, msg *nats.Msg) error {
	if size := headerBlockSize(msg.Header); size > maxHeaderBlock {
		return &dispatch.Error{Permanent: true, Err: fmt.Errorf(
			"nats: event %d: its header block (row headers, aggregate_id, event_type) is %d bytes, above JetStream's limit of %d: retrying cannot help; make the row's headers smaller, then replay",
			ev.ID, size, maxHeaderBlock)}
	}
	return nil
}
