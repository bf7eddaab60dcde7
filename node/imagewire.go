package node

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/gcagent/gcagent/events"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// listedImages is containerd's ListImagesResponse, decoded by listCodec
// straight from the wire into a listing's events (listImages): of each
// image its name, the labels gcagent keeps (events.ImageLabels), its
// creation time, and its target's digest, media type and size. protobuf
// would decode every label and annotation of tens of thousands of records
// into maps, and containerd's client copy them all once more, for a
// listing that drops them at once.
type listedImages struct {
	evs     []events.ImageUpserted
	targets []imageTarget
}

// listedContent is one message of containerd's content List stream,
// decoded by listCodec straight from the wire and handed to each there,
// blob by blob: its digest, its size, and its labels that containerd's
// garbage collector follows (the only ones a listing reads; a pulled
// layer's others, its source and uncompressed digest, are dropped).
type listedContent struct {
	each func(dgst string, size int64, labels gcLabels)
	// intern makes a listing's repeated strings one: label keys, and the
	// digests labels name (a config's, a shared layer's), which are blobs'
	// digests too.
	intern map[string]string
}

// Field numbers of containerd.services.images.v1 and content.v1
// (images.proto, content.proto) and containerd.types.Descriptor.
const (
	fieldListedImages = 1 // ListImagesResponse.images

	fieldImageName      = 1
	fieldImageLabels    = 2
	fieldImageTarget    = 3
	fieldImageCreatedAt = 7

	fieldDescMediaType = 1
	fieldDescDigest    = 2
	fieldDescSize      = 3

	fieldListedInfos = 1 // ListContentResponse.info

	fieldInfoDigest = 1
	fieldInfoSize   = 2
	fieldInfoLabels = 5
)

// readImages is decodeImages of the message in data, read as a stream: a
// busy node's response is one message of megabytes, gRPC receives it in
// pieces, and each image is a few hundred bytes, so it is never put in one
// piece. A message holding a group (an unknown field of the wire type
// protobuf still reads) is decoded by decodeImages.
func (m *listedImages) readImages(data mem.BufferSlice) error {
	n, err := eachTopField(data, func(protowire.Number, protowire.Type, []byte) error { return nil })
	if errors.Is(err, errGroupField) {
		buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
		defer buf.Free()
		return m.decodeImages(buf.ReadOnlyData())
	}
	if err != nil {
		return err
	}
	m.evs, m.targets = make([]events.ImageUpserted, 0, n), make([]imageTarget, 0, n)
	_, err = eachTopField(data, m.add)
	return err
}

// errGroupField says a message holds a group, which eachTopField does not
// read.
var errGroupField = errors.New("group field")

// eachTopField is eachField of the message in data, read as a stream (see
// readImages), for the fields of number fieldListedImages: v is valid until
// f returns. It returns how many there are.
func eachTopField(data mem.BufferSlice, f func(protowire.Number, protowire.Type, []byte) error) (int, error) {
	r := data.Reader()
	defer r.Close()
	var (
		scratch []byte
		n       int
	)
	for r.Remaining() > 0 {
		tag, err := binary.ReadUvarint(r)
		if err != nil || tag>>3 == 0 || tag>>3 > math.MaxInt32 {
			return n, fmt.Errorf("%w: field tag", errWire)
		}
		num, typ := protowire.DecodeTag(tag)
		switch typ {
		case protowire.VarintType:
			_, err = binary.ReadUvarint(r)
		case protowire.Fixed32Type, protowire.Fixed64Type:
			size := int64(4)
			if typ == protowire.Fixed64Type {
				size = 8
			}
			_, err = io.CopyN(io.Discard, r, size)
		case protowire.BytesType:
			var l uint64
			if l, err = binary.ReadUvarint(r); err == nil && l > uint64(r.Remaining()) {
				err = io.ErrUnexpectedEOF
			}
			if err != nil {
				break
			}
			if num != fieldListedImages {
				_, err = io.CopyN(io.Discard, r, int64(l))
				break
			}
			n++
			scratch = slices.Grow(scratch[:0], int(l))[:l]
			if _, err = io.ReadFull(r, scratch); err == nil {
				err = f(num, typ, scratch)
			}
		case protowire.StartGroupType, protowire.EndGroupType:
			return n, errGroupField
		default:
			return n, fmt.Errorf("%w: wire type %d", errWire, typ)
		}
		if err != nil {
			return n, fmt.Errorf("%w: %v", errWire, err)
		}
	}
	return n, nil
}

// add appends the image of one images field of a ListImagesResponse.
func (m *listedImages) add(num protowire.Number, typ protowire.Type, v []byte) error {
	if num != fieldListedImages || typ != protowire.BytesType {
		return nil
	}
	ev, t, err := decodeImage(v)
	m.evs, m.targets = append(m.evs, ev), append(m.targets, t)
	return err
}

// decodeImages decodes a ListImagesResponse into m as proto.Unmarshal and
// containerd's client would (a repeated image is one more image; within
// one, repeated messages merge and the last scalar wins), keeping what
// listedImages says. Labels are events.ImageLabels's; every string is a
// copy.
func (m *listedImages) decodeImages(b []byte) error {
	n := 0
	_ = eachField(b, func(num protowire.Number, typ protowire.Type, _ []byte) error {
		if num == fieldListedImages && typ == protowire.BytesType {
			n++
		}
		return nil
	})
	m.evs, m.targets = make([]events.ImageUpserted, 0, n), make([]imageTarget, 0, n)
	return eachField(b, m.add)
}

func decodeImage(b []byte) (events.ImageUpserted, imageTarget, error) {
	var (
		ev                    events.ImageUpserted
		t                     imageTarget
		pinned, managed       string
		hasPinned, hasManaged bool
		created               struct{ sec, nsec int64 }
	)
	err := eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		if typ != protowire.BytesType {
			return nil
		}
		var err error
		switch num {
		case fieldImageName:
			ev.Name, err = wireString(v)
		case fieldImageLabels:
			var k, val string
			if k, val, err = wireLabel(v); err == nil {
				switch k {
				case events.LabelPinned:
					pinned, hasPinned = val, true
				case events.LabelCRIManaged:
					managed, hasManaged = val, true
				}
			}
		case fieldImageTarget:
			err = decodeDescriptor(v, &ev.Digest, &t)
		case fieldImageCreatedAt:
			err = wireTimestamp(v, &created.sec, &created.nsec)
		}
		return err
	})
	ev.Labels = events.ImageLabelsOf(pinned, hasPinned, managed, hasManaged)
	// What containerd's client makes of a record without a creation time.
	ev.Created = time.Unix(created.sec, created.nsec).UTC()
	return ev, t, err
}

// decodeDescriptor merges a containerd.types.Descriptor into its digest
// and t (annotations are left out).
func decodeDescriptor(b []byte, dgst *string, t *imageTarget) error {
	return eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		var err error
		switch {
		case num == fieldDescSize && typ == protowire.VarintType:
			n, _ := protowire.ConsumeVarint(v)
			t.size = int64(n)
		case typ != protowire.BytesType:
		case num == fieldDescMediaType:
			t.mediaType, err = mediaType(v)
		case num == fieldDescDigest:
			*dgst, err = wireString(v)
		}
		return err
	})
}

// mediaTypes are the media types of image targets, shared instead of
// copied for each of a listing's images.
var mediaTypes = func() map[string]string {
	m := map[string]string{}
	for _, t := range []string{ocispec.MediaTypeImageManifest, ocispec.MediaTypeImageIndex, images.MediaTypeDockerSchema2Manifest,
		images.MediaTypeDockerSchema2ManifestList} {
		m[t] = t
	}
	return m
}()

func mediaType(v []byte) (string, error) {
	if t, ok := mediaTypes[string(v)]; ok {
		return t, nil
	}
	return wireString(v)
}

// wireTimestamp merges a google.protobuf.Timestamp into sec and nsec
// (nanos truncated to their int32, as protobuf does).
func wireTimestamp(b []byte, sec, nsec *int64) error {
	return eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		if typ != protowire.VarintType || (num != fieldSeconds && num != fieldNanos) {
			return nil
		}
		n, _ := protowire.ConsumeVarint(v)
		if num == fieldSeconds {
			*sec = int64(n)
		} else {
			*nsec = int64(int32(n))
		}
		return nil
	})
}

// gcRefLabel is the prefix of the content labels containerd's garbage
// collector follows (labelContentRef, labelSnapshotRef).
const gcRefLabel = "containerd.io/gc.ref."

// decodeContent decodes a ListContentResponse and calls m.each with each
// blob, as proto.Unmarshal would read it, keeping only its gc.ref labels
// (nil if none).
func (m *listedContent) decodeContent(b []byte) error {
	return eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		if num != fieldListedInfos || typ != protowire.BytesType {
			return nil
		}
		var (
			dgst   string
			size   int64
			labels gcLabels
		)
		err := eachField(v, func(num protowire.Number, typ protowire.Type, v []byte) error {
			var err error
			switch {
			case num == fieldInfoSize && typ == protowire.VarintType:
				n, _ := protowire.ConsumeVarint(v)
				size = int64(n)
			case typ != protowire.BytesType:
			case num == fieldInfoDigest:
				dgst, err = m.str(v)
			case num == fieldInfoLabels:
				var k, val []byte
				err = wirePair(v, func(b []byte) error { k = b; return nil }, func(b []byte) error { val = b; return nil })
				if err != nil || !strings.HasPrefix(string(k), gcRefLabel) {
					return err
				}
				var ks, vs string
				if ks, err = m.str(k); err != nil {
					return err
				}
				if vs, err = m.str(val); err != nil {
					return err
				}
				labels = labels.set(ks, vs)
			}
			return err
		})
		if err != nil {
			return err
		}
		m.each(dgst, size, labels)
		return nil
	})
}

// str is wireString, interned in m.intern.
func (m *listedContent) str(v []byte) (string, error) {
	if s, ok := m.intern[string(v)]; ok {
		return s, nil
	}
	s, err := wireString(v)
	if err == nil {
		m.intern[s] = s
	}
	return s, err
}
