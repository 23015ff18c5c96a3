package events

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
	"sort"
)

// The settled ids (history.go) are kept by the hour they ended in: each
// hour's ids sorted and packed, so an id's time costs nothing (the hour is
// the generation's) and the retention drops whole hours. A job id costs a
// byte or three (delta-coded), an attempt two or four, a delivery id its 16
// bytes. Membership is exact, never probabilistic (issue 19).

// keySet is one generation's packed, sorted set of keys.
type keySet[K any, S any] interface {
	has(k K) bool
	len() int
	// with is the set with more added (more in any order, duplicates
	// allowed); the receiver is left as it was.
	with(more []K) S
}

// hourly is a set of keys by the hour (unix seconds ÷ 3600) they ended in.
type hourly[K any, S keySet[K, S]] struct {
	proto S            // an empty set, as each new generation starts
	gens  []hourGen[S] // oldest first, one per hour
}

type hourGen[S any] struct {
	hour int64
	set  S
}

// stamped is a key and when it ended (unix seconds).
type stamped[K any] struct {
	key K
	at  int64
}

func hourOf(unix int64) int64 {
	if unix < 0 {
		return (unix - 3599) / 3600
	}
	return unix / 3600
}

func (h *hourly[K, S]) has(k K) bool {
	// The newest first: a late fact is mostly about what ended lately.
	for i := len(h.gens) - 1; i >= 0; i-- {
		if h.gens[i].set.has(k) {
			return true
		}
	}
	return false
}

func (h *hourly[K, S]) len() int {
	n := 0
	for _, g := range h.gens {
		n += g.set.len()
	}
	return n
}

// add puts each key in its hour's generation. A Compact adds what settled
// since the last, so mostly one or two generations are rebuilt, in
// O(their size).
func (h *hourly[K, S]) add(more []stamped[K]) {
	byHour := map[int64][]K{}
	for _, m := range more {
		byHour[hourOf(m.at)] = append(byHour[hourOf(m.at)], m.key)
	}
	for hour, keys := range byHour {
		i, ok := slices.BinarySearchFunc(h.gens, hour, func(g hourGen[S], hour int64) int { return cmp.Compare(g.hour, hour) })
		if ok {
			h.gens[i].set = h.gens[i].set.with(keys)
			continue
		}
		h.gens = slices.Insert(h.gens, i, hourGen[S]{hour, h.proto.with(keys)})
	}
}

// dropBefore drops the generations whose every key ended before cut (unix
// seconds): a key stays at most an hour past it.
func (h *hourly[K, S]) dropBefore(cut int64) {
	n := 0
	for n < len(h.gens) && (h.gens[n].hour+1)*3600 <= cut {
		n++
	}
	h.gens = slices.Delete(h.gens, 0, n)
}

// packBlock is how many keys a packed block holds: a lookup decodes at
// most this many after a binary search of the blocks' first keys.
const packBlock = 64

// packed is a sorted set of uint64 keys in blocks: each block's first key
// whole (in heads), the others as the uvarint difference from the one
// before. low bits of a key (an attempt's number) are coded apart from
// the rest, after it: key 1<<16|1 then 2<<16|1 costs two bytes, not three.
type packed struct {
	low   uint8
	n     int
	last  uint64
	heads []packHead
	data  []byte
}

type packHead struct {
	key uint64
	off uint32 // where the block's other keys start in data
}

func (p packed) len() int { return p.n }

func (p packed) has(k uint64) bool {
	if p.n == 0 || k < p.heads[0].key || k > p.last {
		return false
	}
	i := sort.Search(len(p.heads), func(i int) bool { return p.heads[i].key > k }) - 1
	h := p.heads[i]
	if h.key == k {
		return true
	}
	end := len(p.data)
	if i+1 < len(p.heads) {
		end = int(p.heads[i+1].off)
	}
	cur := h.key
	for off := int(h.off); off < end; {
		cur, off = p.next(p.data, cur, off)
		if cur >= k {
			return cur == k
		}
	}
	return false
}

// next decodes the key after cur at off in data.
func (p packed) next(data []byte, cur uint64, off int) (uint64, int) {
	d, n := binary.Uvarint(data[off:])
	off += n
	k := (cur>>p.low + d) << p.low
	if p.low > 0 {
		lo, n := binary.Uvarint(data[off:])
		off += n
		k |= lo
	}
	return k, off
}

// keys decodes the whole set, in order.
func (p packed) keys() []uint64 {
	out := make([]uint64, 0, p.n)
	for i, h := range p.heads {
		end := len(p.data)
		if i+1 < len(p.heads) {
			end = int(p.heads[i+1].off)
		}
		cur := h.key
		out = append(out, cur)
		for off := int(h.off); off < end; {
			cur, off = p.next(p.data, cur, off)
			out = append(out, cur)
		}
	}
	return out
}

func (p packed) with(more []uint64) packed {
	keys := slices.Compact(merged(p.keys(), more, cmp.Compare[uint64]))
	return packKeys(p.low, keys)
}

// packKeys packs sorted, distinct keys.
func packKeys(low uint8, keys []uint64) packed {
	out := packed{low: low, n: len(keys)}
	if len(keys) == 0 {
		return out
	}
	out.heads = make([]packHead, 0, (len(keys)+packBlock-1)/packBlock)
	var prev uint64
	for i, k := range keys {
		if i%packBlock == 0 {
			out.heads = append(out.heads, packHead{k, uint32(len(out.data))})
		} else {
			out.data = appendKey(out.data, low, prev, k)
		}
		prev = k
	}
	out.last = prev
	out.data = slices.Clip(out.data)
	return out
}

func appendKey(b []byte, low uint8, prev, k uint64) []byte {
	b = binary.AppendUvarint(b, k>>low-prev>>low)
	if low > 0 {
		b = binary.AppendUvarint(b, k&(1<<low-1))
	}
	return b
}

// marshal writes every key as the difference from the one before (the
// first from 0): a snapshot's form, without the block heads.
func (p packed) marshal() []byte {
	var b []byte
	var prev uint64
	for _, k := range p.keys() {
		b = appendKey(b, p.low, prev, k)
		prev = k
	}
	return b
}

func unmarshalPacked(low uint8, b []byte) (packed, error) {
	var keys []uint64
	var cur uint64
	bad := func(off int) (packed, error) {
		return packed{low: low}, fmt.Errorf("packed ids: bad or unsorted key at byte %d", off)
	}
	for off := 0; off < len(b); {
		start := off
		d, n := binary.Uvarint(b[off:])
		if n <= 0 {
			return bad(start)
		}
		off += n
		var lo uint64
		if low > 0 {
			if lo, n = binary.Uvarint(b[off:]); n <= 0 || lo >= 1<<low {
				return bad(start)
			}
			off += n
		}
		k := (cur>>low+d)<<low | lo
		if len(keys) > 0 && k <= cur {
			return bad(start)
		}
		keys, cur = append(keys, k), k
	}
	return packKeys(low, keys), nil
}

// uuids is a sorted set of GitHub delivery ids, 16 bytes each, end to end.
type uuids []byte

func (u uuids) len() int { return len(u) / 16 }

func (u uuids) at(i int) []byte { return u[16*i : 16*i+16] }

func (u uuids) has(id uuidID) bool {
	n := u.len()
	i := sort.Search(n, func(i int) bool { return bytes.Compare(u.at(i), id[:]) >= 0 })
	return i < n && bytes.Equal(u.at(i), id[:])
}

func (u uuids) with(more []uuidID) uuids {
	cmpID := func(a, b uuidID) int { return bytes.Compare(a[:], b[:]) }
	old := make([]uuidID, u.len())
	for i := range old {
		copy(old[i][:], u.at(i))
	}
	all := slices.Compact(merged(old, more, cmpID))
	out := make(uuids, 0, 16*len(all))
	for _, id := range all {
		out = append(out, id[:]...)
	}
	return out
}

// snapHour is one generation in a snapshot: its hour and its packed ids
// (packed.marshal, or uuids as they are).
type snapHour struct {
	Hour int64  `json:"hour"`
	IDs  []byte `json:"ids"`
}

func marshalPackedHours(h hourly[uint64, packed]) []snapHour {
	out := make([]snapHour, 0, len(h.gens))
	for _, g := range h.gens {
		out = append(out, snapHour{g.hour, g.set.marshal()})
	}
	return out
}

func unmarshalPackedHours(low uint8, in []snapHour) (hourly[uint64, packed], error) {
	h := hourly[uint64, packed]{proto: packed{low: low}}
	for _, s := range in {
		p, err := unmarshalPacked(low, s.IDs)
		if err != nil {
			return h, err
		}
		h.gens = append(h.gens, hourGen[packed]{s.Hour, p})
	}
	return h, sortedHours(h.gens)
}

func marshalUUIDHours(h hourly[uuidID, uuids]) []snapHour {
	out := make([]snapHour, 0, len(h.gens))
	for _, g := range h.gens {
		out = append(out, snapHour{g.hour, g.set})
	}
	return out
}

func unmarshalUUIDHours(in []snapHour) (hourly[uuidID, uuids], error) {
	var h hourly[uuidID, uuids]
	for _, s := range in {
		if len(s.IDs)%16 != 0 {
			return h, fmt.Errorf("settled deliveries: %d bytes, not a multiple of 16", len(s.IDs))
		}
		u := uuids(s.IDs)
		for i := 1; i < u.len(); i++ {
			if bytes.Compare(u.at(i-1), u.at(i)) >= 0 {
				return h, fmt.Errorf("settled deliveries: unsorted at id %d", i)
			}
		}
		h.gens = append(h.gens, hourGen[uuids]{s.Hour, u})
	}
	return h, sortedHours(h.gens)
}

func sortedHours[S any](gens []hourGen[S]) error {
	for i := 1; i < len(gens); i++ {
		if gens[i-1].hour >= gens[i].hour {
			return fmt.Errorf("settled ids: hour %d after hour %d", gens[i].hour, gens[i-1].hour)
		}
	}
	return nil
}
