// Package logx builds Berth's slog loggers: JSON where a machine reads the
// output (a container, a service manager's journal), human text on a
// terminal, and secrets redacted in both.
package logx

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strings"
)

// Formats accepted by New.
const (
	FormatAuto = "auto" // text on a terminal, JSON otherwise
	FormatJSON = "json"
	FormatText = "text"
)

// Redacted replaces a secret in a log line.
const Redacted = "[REDACTED]"

// New returns a logger writing to w at level in format (auto, json or text).
// auto picks text when w is a terminal, JSON otherwise (containers, systemd,
// launchd, files). Every record passes through Redact. It returns an error
// naming the accepted values for an unknown format or level.
func New(w io.Writer, level, format string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl, ReplaceAttr: Redact}
	switch format {
	case FormatAuto, "":
		if terminal(w) {
			return slog.New(slog.NewTextHandler(w, opts)), nil
		}
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case FormatJSON:
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case FormatText:
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: want auto, json or text", format)
}

// terminal reports whether w is a character device (a terminal).
func terminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// secretKey matches attribute keys whose values are secrets whatever they
// look like.
var secretKey = regexp.MustCompile(`(?i)(secret|token|password|passwd|jit|seed|creds|credential|authorization|private|api_key)`)

// secretValue matches secrets inside any string: GitHub tokens (classic
// prefixes gh[pousr]_ and fine-grained github_pat_, per GitHub's token
// formats), JWTs (an App's, or an installation's), NATS nkey seeds
// (S + a key-type letter, base32), and long base64 blobs (an encoded JIT
// config is about 2 KB of base64; nothing Berth logs on purpose is).
var secretValue = regexp.MustCompile(`gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*|\bS[UAONXPC][A-Z2-7]{54,}\b|[A-Za-z0-9+/]{200,}={0,2}`)

// Redact is a slog ReplaceAttr: it blanks the value of an attribute whose
// key names a secret (token, secret, jit, seed, creds…), and cuts secrets
// out of every other string or error value. Durations print as "1m30s".
func Redact(_ []string, a slog.Attr) slog.Attr {
	if a.Key == slog.MessageKey || a.Key == slog.LevelKey || a.Key == slog.TimeKey || a.Key == slog.SourceKey {
		if a.Key == slog.MessageKey {
			a.Value = slog.StringValue(Scrub(a.Value.String()))
		}
		return a
	}
	if a.Value.Kind() == slog.KindGroup {
		return a
	}
	if secretKey.MatchString(a.Key) && !harmlessKey(a.Key) {
		return slog.String(a.Key, Redacted)
	}
	switch a.Value.Kind() {
	case slog.KindDuration: // "1m30s", not nanoseconds, in JSON too
		a.Value = slog.StringValue(a.Value.Duration().String())
	case slog.KindString:
		a.Value = slog.StringValue(Scrub(a.Value.String()))
	case slog.KindAny:
		if err, ok := a.Value.Any().(error); ok {
			a.Value = slog.StringValue(Scrub(err.Error()))
		} else if s, ok := a.Value.Any().(fmt.Stringer); ok {
			a.Value = slog.StringValue(Scrub(s.String()))
		}
	}
	return a
}

// harmlessKey lists keys that match secretKey but carry no secret.
func harmlessKey(k string) bool {
	k = strings.ToLower(k)
	return k == "token_env" || k == "webhook_secret_env" || k == "creds_file" || strings.HasSuffix(k, "_path")
}

// Scrub replaces every secret-looking run in s.
func Scrub(s string) string {
	if len(s) < 20 { // shorter than any secret it knows
		return s
	}
	return secretValue.ReplaceAllString(s, Redacted)
}
