package node

import (
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/typeurl/v2"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/anypb"
)

// streamedContainer is one message of containerd's container ListStream,
// decoded by listCodec straight from the wire and handed to each there: a
// busy node's records carry 10 KiB and more of spec and extensions each,
// which protobuf would copy for every record although a listing reads them
// only for containers the projection does not know yet, and then only a
// few fields of them.
type streamedContainer struct {
	// bodies reports, once c holds the record's other fields, whether its
	// spec and CRI metadata are wanted.
	bodies func(c *containers.Container) bool
	// each is called with the record while the message's buffer is valid:
	// its spec and extension values are that buffer, and must not be kept.
	each func(c containers.Container)
}

// listCodec is gRPC's proto codec, but for the listings' messages
// (streamedContainer, listedImages, listedContent), which it decodes
// itself. Name is "proto": the content type stays application/grpc.
type listCodec struct{ encoding.CodecV2 }

func newListCodec() listCodec { return listCodec{encoding.GetCodecV2(grpcproto.Name)} }

// Unmarshal decodes a streamedContainer, listedImages or listedContent
// itself, any other message as protobuf does.
func (lc listCodec) Unmarshal(data mem.BufferSlice, v any) error {
	switch m := v.(type) {
	case *streamedContainer, *listedContent:
	case *listedImages:
		return m.readImages(data)
	default:
		return lc.CodecV2.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	switch m := v.(type) {
	case *streamedContainer:
		c, err := decodeListed(b, m.bodies)
		if err != nil {
			return err
		}
		m.each(c)
	case *listedContent:
		return m.decodeContent(b)
	}
	return nil
}

// Field numbers of containerd.services.containers.v1 (containers.proto),
// google.protobuf.Any and google.protobuf.Timestamp.
const (
	fieldListedContainer = 1 // ListContainerMessage.container

	fieldID          = 1
	fieldLabels      = 2
	fieldImage       = 3
	fieldSpec        = 5
	fieldSnapshotter = 6
	fieldSnapshotKey = 7
	fieldCreatedAt   = 8
	fieldExtensions  = 10
	fieldSandbox     = 11

	fieldKey, fieldValue     = 1, 2 // a map entry; Any is {type_url: 1, value: 2} alike
	fieldSeconds, fieldNanos = 1, 2
)

var errWire = errors.New("malformed protobuf")

// decodeListed decodes a ListContainerMessage as proto.Unmarshal and
// containerd's client would (repeated messages merge, the last scalar wins,
// a field of an unexpected wire type is skipped), keeping what a listing
// reads: id, labels, image, snapshotter and key, creation time, sandbox,
// and, when bodies says so, the spec and the CRI metadata extension (the
// other extensions, the runtime and the update time are left out). The
// strings are copies; the spec's and extension's values are slices of b.
func decodeListed(b []byte, bodies func(*containers.Container) bool) (containers.Container, error) {
	var (
		c       containers.Container
		parts   [][]byte // the record, as it may come in several pieces that merge
		created struct{ sec, nsec int64 }
	)
	if err := eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		if num == fieldListedContainer && typ == protowire.BytesType {
			parts = append(parts, v)
		}
		return nil
	}); err != nil {
		return c, err
	}
	for _, p := range parts {
		if err := eachField(p, func(num protowire.Number, typ protowire.Type, v []byte) error {
			if typ != protowire.BytesType {
				return nil
			}
			var err error
			switch num {
			case fieldID:
				c.ID, err = wireString(v)
			case fieldImage:
				c.Image, err = wireString(v)
			case fieldSnapshotter:
				c.Snapshotter, err = wireString(v)
			case fieldSnapshotKey:
				c.SnapshotKey, err = wireString(v)
			case fieldSandbox:
				c.SandboxID, err = wireString(v)
			case fieldLabels:
				var k, val string
				if k, val, err = wireLabel(v); err == nil {
					if c.Labels == nil {
						c.Labels = map[string]string{}
					}
					c.Labels[k] = val
				}
			case fieldCreatedAt:
				err = eachField(v, func(num protowire.Number, typ protowire.Type, v []byte) error {
					if typ != protowire.VarintType || (num != fieldSeconds && num != fieldNanos) {
						return nil
					}
					n, _ := protowire.ConsumeVarint(v)
					if num == fieldSeconds {
						created.sec = int64(n)
					} else {
						created.nsec = int64(int32(n))
					}
					return nil
				})
			}
			return err
		}); err != nil {
			return c, err
		}
	}
	// What containerd's client makes of a record without a creation time.
	c.CreatedAt = time.Unix(created.sec, created.nsec).UTC()
	if bodies == nil || !bodies(&c) {
		return c, nil
	}
	for _, p := range parts {
		if err := eachField(p, func(num protowire.Number, typ protowire.Type, v []byte) error {
			if typ != protowire.BytesType {
				return nil
			}
			switch num {
			case fieldSpec:
				if c.Spec == nil {
					c.Spec = &anypb.Any{}
				}
				return wireAny(v, c.Spec.(*anypb.Any))
			case fieldExtensions:
				return wireExtension(v, &c)
			}
			return nil
		}); err != nil {
			return c, err
		}
	}
	return c, nil
}

// eachField calls f with each field of message b: its number, wire type
// and value (a varint's encoding, a length-delimited field's payload).
func eachField(b []byte, f func(protowire.Number, protowire.Type, []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("%w: %v", errWire, protowire.ParseError(n))
		}
		b = b[n:]
		var v []byte
		if typ == protowire.BytesType {
			v, n = protowire.ConsumeBytes(b)
		} else {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n >= 0 {
				v = b[:n]
			}
		}
		if n < 0 {
			return fmt.Errorf("%w: %v", errWire, protowire.ParseError(n))
		}
		b = b[n:]
		if err := f(num, typ, v); err != nil {
			return err
		}
	}
	return nil
}

// wireString is a proto3 string field: valid UTF-8, copied out of the
// buffer gRPC reuses.
func wireString(v []byte) (string, error) {
	if !utf8.Valid(v) {
		return "", fmt.Errorf("%w: invalid UTF-8 in a string field", errWire)
	}
	return string(v), nil
}

// wirePair calls key and value with the length-delimited fields 1 and 2
// of v (a map entry; an Any's type_url and value), in their order; other
// fields are skipped.
func wirePair(v []byte, key, value func([]byte) error) error {
	return eachField(v, func(num protowire.Number, typ protowire.Type, v []byte) error {
		switch {
		case typ != protowire.BytesType:
			return nil
		case num == fieldKey:
			return key(v)
		case num == fieldValue:
			return value(v)
		}
		return nil
	})
}

// wireLabel is one labels map entry: a missing key or value is "".
func wireLabel(v []byte) (k, val string, err error) {
	err = wirePair(v,
		func(b []byte) (err error) { k, err = wireString(b); return err },
		func(b []byte) (err error) { val, err = wireString(b); return err })
	return k, val, err
}

// wireAny merges a google.protobuf.Any into a; its value is a slice of v.
func wireAny(v []byte, a *anypb.Any) error {
	return wirePair(v,
		func(b []byte) (err error) { a.TypeUrl, err = wireString(b); return err },
		func(b []byte) error { a.Value = b; return nil })
}

// wireExtension keeps one extensions map entry if it is CRI's metadata;
// an entry without a value holds an empty Any, as protobuf's do.
func wireExtension(v []byte, c *containers.Container) error {
	var (
		key string
		val = &anypb.Any{}
	)
	err := wirePair(v,
		func(b []byte) (err error) { key, err = wireString(b); return err },
		func(b []byte) error { return wireAny(b, val) })
	if err != nil || key != extCRIContainerMetadata {
		return err
	}
	if c.Extensions == nil {
		c.Extensions = map[string]typeurl.Any{}
	}
	c.Extensions[key] = val
	return nil
}
