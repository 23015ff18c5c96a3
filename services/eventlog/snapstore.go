package eventlog

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"sync/atomic"

	"github.com/berth-ci/berth/events"
	"github.com/klauspost/compress/gzip"
	"github.com/nats-io/nats.go/jetstream"
)

// A snapshot is stored gzipped under its key. One that is still larger
// than a message may be (the server's max_payload, 1 MiB by default: a
// dispatcher's fold of a few thousand retained jobs is more) is split into
// parts stored under KEY.g<GEN>.<i> (events.SnapshotPartKey), and the key holds a manifest naming
// them. Parts are written first and the manifest last, so a crash between
// leaves the previous snapshot whole; parts of older generations are
// deleted once the new manifest is stored. A key holding plain JSON (an
// older build's snapshot) is read as it is.

// manifestPrefix starts a manifest value; gzip data starts with 0x1f 0x8b
// and a plain snapshot with '{', so the three cannot be confused.
const manifestPrefix = "berth-snapshot-parts:"

type manifest struct {
	Gen    uint64 `json:"gen"`    // the stream sequence the snapshot covers
	Parts  int    `json:"parts"`  // KEY.g<GEN>.0 … KEY.g<GEN>.<Parts-1>
	Bytes  int    `json:"bytes"`  // gzipped size, all parts together
	SHA256 string `json:"sha256"` // of the gzipped bytes
}

// partLimit is the largest value stored in one message: the server's
// max_payload less room for headers (8 KiB, or a quarter of a small
// max_payload), or 512 KiB when it is unknown, and never over maxPart.
func partLimit(js jetstream.JetStream) int {
	if nc := js.Conn(); nc != nil {
		if mp := int(nc.MaxPayload()); mp > 0 {
			return min(maxPart, mp-min(8<<10, mp/4))
		}
	}
	return min(maxPart, 512<<10)
}

// maxPart caps a snapshot's part: nats.go keeps its connection's write
// buffer at the size of the largest message it sent (natsWriter.bufs is
// only ever cut to length 0), so a service that stored a 4 MiB part once
// keeps 4 MiB for as long as it runs.
const maxPart = 256 << 10

// PutSnapshot stores b (a fold snapshot, covering stream sequence gen)
// under key, gzipped and split into parts when it does not fit one message.
// The gzip is klauspost/compress's (the NATS server's own): the same
// format, written about twice as fast as the standard library's,
// and a snapshot of a busy fleet's fold is tens of megabytes a minute.
func PutSnapshot(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, key string, gen uint64, b []byte) error {
	z, err := gzipSnapshot(func(w io.Writer) error {
		_, err := w.Write(b)
		return err
	})
	if err != nil {
		return err
	}
	return putZipped(ctx, js, kv, key, gen, z)
}

// putZipped stores a compressed snapshot as PutSnapshot says.
func putZipped(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, key string, gen uint64, z *bytes.Buffer) error {
	prev := storedManifest(ctx, kv, key)
	limit := partLimit(js)
	if z.Len() <= limit {
		if _, err := kv.Put(ctx, key, z.Bytes()); err != nil {
			return err
		}
		return deleteParts(ctx, kv, key, prev)
	}
	sum := sha256.Sum256(z.Bytes())
	m := manifest{Gen: gen, Bytes: z.Len(), SHA256: hex.EncodeToString(sum[:])}
	for data := z.Bytes(); len(data) > 0; m.Parts++ {
		n := min(limit, len(data))
		if _, err := kv.Put(ctx, events.SnapshotPartKey(key, gen, m.Parts), data[:n]); err != nil {
			return fmt.Errorf("part %d: %w", m.Parts, err)
		}
		data = data[n:]
	}
	mb, _ := json.Marshal(m)
	if _, err := kv.Put(ctx, key, append([]byte(manifestPrefix), mb...)); err != nil {
		return err
	}
	if prev != nil && prev.Gen == gen {
		return nil // the same parts, rewritten
	}
	return deleteParts(ctx, kv, key, prev)
}

// compressors keeps up to four gzip writers between snapshots. A new one
// allocates about 1 MB of tables, for an agent's snapshot of a few
// kilobytes as for a dispatcher's of megabytes; a process that runs many
// loops (the bench's world process runs 500 agents, each saving once a
// minute) spent a third of its CPU making and clearing them. A bounded
// list, not a sync.Pool: the pool is emptied by every other collection,
// and a loop saves once a minute, so it would make one each time anyway.
// A process keeps at most 4 MB for them.
var compressors = make(chan *gzip.Writer, 4)

// compressorsMade counts the gzip writers made (for the test that they are
// reused).
var compressorsMade atomic.Int64

// gzipSnapshot compresses what encode writes, with a reused writer.
func gzipSnapshot(encode func(w io.Writer) error) (*bytes.Buffer, error) {
	z := &bytes.Buffer{}
	var zw *gzip.Writer
	select {
	case zw = <-compressors:
		zw.Reset(z)
	default:
		compressorsMade.Add(1)
		zw = gzip.NewWriter(z)
	}
	defer func() {
		zw.Reset(io.Discard) // the list must not keep z alive
		select {
		case compressors <- zw:
		default: // four are kept already
		}
	}()
	if err := encode(zw); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return z, nil
}

// GetSnapshot reads what PutSnapshot stored under key (or a plain JSON
// snapshot of an older build). It returns jetstream.ErrKeyNotFound when
// there is none, and an error naming the part when one is missing or the
// parts do not add up: the caller then replays the whole log.
func GetSnapshot(ctx context.Context, kv jetstream.KeyValue, key string) ([]byte, error) {
	e, err := kv.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	v := e.Value()
	if rest, ok := bytes.CutPrefix(v, []byte(manifestPrefix)); ok {
		var m manifest
		if err := json.Unmarshal(rest, &m); err != nil {
			return nil, fmt.Errorf("snapshot manifest of %s: %w", key, err)
		}
		var z bytes.Buffer
		for i := range m.Parts {
			p, err := kv.Get(ctx, events.SnapshotPartKey(key, m.Gen, i))
			if err != nil {
				return nil, fmt.Errorf("snapshot %s part %d of %d: %w", key, i+1, m.Parts, err)
			}
			z.Write(p.Value())
		}
		if sum := sha256.Sum256(z.Bytes()); z.Len() != m.Bytes || hex.EncodeToString(sum[:]) != m.SHA256 {
			return nil, fmt.Errorf("snapshot %s: its %d parts do not match the manifest's size and digest", key, m.Parts)
		}
		v = z.Bytes()
	}
	if len(v) < 2 || v[0] != 0x1f || v[1] != 0x8b {
		return v, nil // plain JSON, as older builds stored it
	}
	zr, err := gzip.NewReader(bytes.NewReader(v))
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", key, err)
	}
	return io.ReadAll(zr)
}

// storedManifest is the manifest key holds now, or nil (none, or a
// snapshot in one value).
func storedManifest(ctx context.Context, kv jetstream.KeyValue, key string) *manifest {
	e, err := kv.Get(ctx, key)
	if err != nil {
		return nil
	}
	rest, ok := bytes.CutPrefix(e.Value(), []byte(manifestPrefix))
	var m manifest
	if !ok || json.Unmarshal(rest, &m) != nil {
		return nil
	}
	return &m
}

// deleteParts removes the parts m names (nil: none). Keys are named, not
// listed: an agent may read and write its own keys and nothing else.
func deleteParts(ctx context.Context, kv jetstream.KeyValue, key string, m *manifest) error {
	if m == nil {
		return nil
	}
	for i := range m.Parts {
		if err := kv.Delete(ctx, events.SnapshotPartKey(key, m.Gen, i)); err != nil {
			return fmt.Errorf("removing part %d of an older snapshot: %w", i, err)
		}
	}
	return nil
}
