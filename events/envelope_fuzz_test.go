package events_test

import (
	stdjson "encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/berth-ci/berth/events"
)

// Unmarshal decodes with a faster JSON package than encoding/json (replay
// is mostly decoding). Given any bytes, it never panics; what it accepts,
// encoding/json accepts too (but for a duration written as a string) and,
// for valid UTF-8, decodes to the same event; and an accepted event survives Marshal and
// Unmarshal unchanged. Seeded with every stage of a job's facts, stored
// as the services store them, and a few malformed envelopes.
func FuzzUnmarshal(f *testing.F) {
	for _, p := range benchLifecycle(42, "host-1", stageDone) {
		b, err := events.Marshal(events.New("berth/fuzz", t0, p))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{``, `{}`, `null`, `{"specversion":"1.0","id":"x","type":"berth.job.queued.v1","data":{"job_id":"7"}}`,
		`{"specversion":"1.0","id":"x","type":"berth.job.queued.v1","time":"yesterday","data":{}}`,
		`{"specversion":"1.0","id":"x","type":"berth.attempt.placed.v1","data":{"sealed_jit":"!!"}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ev, err := events.Unmarshal(b, 9)
		if err != nil || !utf8.Valid(b) {
			return // invalid UTF-8 in a string: encoding/json puts U+FFFD, go-json keeps the bytes
		}
		var env events.Envelope
		if err := stdjson.Unmarshal(b, &env); err != nil {
			t.Fatalf("accepted %q, which encoding/json refuses: %v", b, err)
		}
		want := events.Types()[env.Type]
		p := reflect.New(reflect.TypeOf(want).Elem()).Interface()
		if err := stdjson.Unmarshal(env.Data, p); err != nil {
			var te *stdjson.UnmarshalTypeError
			if errors.As(err, &te) && te.Type == reflect.TypeOf(time.Duration(0)) {
				return // the known difference: a duration as a string ("40ms")
			}
			t.Fatalf("accepted the data of %q, which encoding/json refuses: %v", b, err)
		}
		if !reflect.DeepEqual(ev.Data, p) {
			t.Fatalf("%q decodes to %#v, encoding/json to %#v", b, ev.Data, p)
		}
		again, err := events.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		back, err := events.Unmarshal(again, 9)
		if err != nil {
			t.Fatalf("%q, marshalled again as %q, does not decode: %v", b, again, err)
		}
		// Compared as bytes: an empty list and none encode alike.
		if twice, err := events.Marshal(back); err != nil || string(twice) != string(again) {
			t.Fatalf("%q does not survive Marshal and Unmarshal: %q, then %q (%v)", b, again, twice, err)
		}
	})
}
