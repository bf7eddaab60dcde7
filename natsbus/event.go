package natsbus

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gcagent/gcagent/schema"
	"github.com/nats-io/nats.go"
)

// Subject and header constants of the NATS contract (see docs/architecture.md).
const (
	// EventPrefix is the first tokens of every event subject.
	EventPrefix = "gcagent.v1.evt"
	// ControlPrefix is the first tokens of every control subject.
	ControlPrefix = "gcagent.v1.ctl"
	// AllNodes is the node token of control subjects addressed to every node of a cluster.
	AllNodes = "all"

	// Schema is the value of the Gcagent-Schema header: the version of the payload contract.
	Schema = "gcagent.v1"
	// ContentType is the value of the Content-Type header: a structured-mode CloudEvent.
	ContentType = "application/cloudevents+json"

	// HeaderContentType names the payload's media type.
	HeaderContentType = "Content-Type"
	// HeaderSchema names the payload contract version.
	HeaderSchema = "Gcagent-Schema"
	// HeaderNode names the node that published the event.
	HeaderNode = "Gcagent-Node"
)

// Subject returns the event subject gcagent.v1.evt.<cluster>.<node>.<kind>.<action>, each token made safe by SafeToken.
func Subject(cluster, node, kind, action string) string {
	return EventPrefix + "." + SafeToken(cluster) + "." + SafeToken(node) + "." + SafeToken(kind) + "." + SafeToken(action)
}

// ControlSubject returns the control subject gcagent.v1.ctl.<cluster>.<node>.<verb> (node may be AllNodes), each token made safe by SafeToken.
func ControlSubject(cluster, node, verb string) string {
	return ControlPrefix + "." + SafeToken(cluster) + "." + SafeToken(node) + "." + SafeToken(verb)
}

// SafeToken returns s usable as exactly one subject token: every byte that is
// not printable ASCII, and every '.', '*', '>' and space, becomes '_'; an
// empty s becomes "_". It is deterministic but not injective ("a.b" and "a_b"
// map to the same token), which is why payloads carry the raw names.
func SafeToken(s string) string {
	if s == "" {
		return "_"
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || c == '.' || c == '*' || c == '>' {
			c = '_'
		}
		b.WriteByte(c)
	}
	return b.String()
}

// CloudEvent is a CloudEvents 1.0 event in structured JSON mode.
type CloudEvent struct {
	SpecVersion     string          `json:"specversion"`
	ID              string          `json:"id"`
	Source          string          `json:"source"`
	Type            string          `json:"type"`
	Subject         string          `json:"subject,omitempty"`
	Time            time.Time       `json:"time"`
	DataContentType string          `json:"datacontenttype"`
	Data            json.RawMessage `json:"data,omitempty"`
}

// Action is one thing the agent did or decided, to be published as one
// CloudEvent (schema.Action).
type Action = schema.Action

// EventID returns the deterministic event id of an action: the first 128 bits
// of sha256("<cluster>/<node>/<kind>/<action>/<key>") in hex. The same inputs
// always give the same id, so a retry is a duplicate for JetStream.
func EventID(cluster, node, kind, action, key string) string {
	sum := sha256.Sum256([]byte(cluster + "/" + node + "/" + kind + "/" + action + "/" + key))
	return hex.EncodeToString(sum[:16])
}

// NewEvent builds the CloudEvent of an action done by node in cluster at now;
// it fails when Kind or Action is empty, Key is empty, or Data does not marshal.
func NewEvent(cluster, node string, a Action, now time.Time) (CloudEvent, error) {
	if a.Kind == "" || a.Action == "" {
		return CloudEvent{}, errors.New("natsbus: action needs a kind and an action")
	}
	if a.Key == "" {
		return CloudEvent{}, fmt.Errorf("natsbus: %s.%s action has no key", a.Kind, a.Action)
	}
	ev := CloudEvent{
		SpecVersion:     "1.0",
		ID:              EventID(cluster, node, a.Kind, a.Action, a.Key),
		Source:          "gcagent/" + cluster + "/" + node,
		Type:            "io.gcagent." + SafeToken(a.Kind) + "." + SafeToken(a.Action),
		Subject:         a.Subject,
		Time:            now.UTC(),
		DataContentType: "application/json",
	}
	if a.Data != nil {
		data, err := json.Marshal(a.Data)
		if err != nil {
			return CloudEvent{}, fmt.Errorf("natsbus: marshal %s.%s data: %w", a.Kind, a.Action, err)
		}
		ev.Data = data
	}
	return ev, nil
}

// randomKey returns a fresh random action key for actions submitted without one.
func randomKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand panics rather than return an error)
	return "rand/" + hex.EncodeToString(b[:])
}

// newMsg returns the NATS message for a stored event: the payload as stored,
// the app headers and Nats-Msg-Id = id, identical on every retry.
func newMsg(subject, node, id string, payload []byte) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Data = payload
	m.Header.Set(HeaderContentType, ContentType)
	m.Header.Set(HeaderSchema, Schema)
	m.Header.Set(HeaderNode, node)
	m.Header.Set(nats.MsgIdHdr, id)
	return m
}
