package dispatch

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/bradleyfalzon/ghinstallation/v2"
	"github.com/golang-jwt/jwt/v4"
)

// App identifies a GitHub App installation. The private key is the PEM the
// App's settings page downloads.
type App struct {
	ID             int64
	InstallationID int64
	PrivateKeyFile string
}

// JWT timing. GitHub rejects an App JWT whose iat is in the future or whose
// exp is more than 10 minutes after it ("Authenticating as a GitHub App",
// docs.github.com); backdating iat by 60 s keeps a host whose clock runs up
// to a minute fast from being refused.
const (
	jwtBackdate = 60 * time.Second
	jwtLifetime = 9 * time.Minute // from the backdated iat: well inside the 10 min limit
)

// skewProofSigner re-times the claims ghinstallation builds (iat now-30s,
// exp +2m) to iat now-60s and exp iat+9m before signing.
type skewProofSigner struct {
	inner ghinstallation.Signer
	now   func() time.Time
}

func (s skewProofSigner) Sign(claims jwt.Claims) (string, error) {
	if rc, ok := claims.(*jwt.RegisteredClaims); ok {
		iat := s.now().Add(-jwtBackdate).Truncate(time.Second)
		rc.IssuedAt = jwt.NewNumericDate(iat)
		rc.ExpiresAt = jwt.NewNumericDate(iat.Add(jwtLifetime))
	}
	return s.inner.Sign(claims)
}

// AppTransport returns an http.RoundTripper that authenticates as the App's
// installation: it mints installation tokens (POST
// /app/installations/{id}/access_tokens at apiURL) with a skew-proof JWT
// and refreshes them before they expire (ghinstallation).
func AppTransport(app App, apiURL string, base http.RoundTripper, now func() time.Time) (http.RoundTripper, error) {
	atr, err := appsTransport(app, apiURL, base, now)
	if err != nil {
		return nil, err
	}
	tr := ghinstallation.NewFromAppsTransport(atr, app.InstallationID)
	tr.BaseURL = atr.BaseURL
	return tr, nil
}

// AppJWTTransport returns an http.RoundTripper that authenticates as the App
// itself, with the same skew-proof JWT: what the App's own endpoints need
// (GET /app/hook/deliveries and its redeliveries), which refuse an
// installation token.
func AppJWTTransport(app App, apiURL string, base http.RoundTripper, now func() time.Time) (http.RoundTripper, error) {
	return appsTransport(app, apiURL, base, now)
}

func appsTransport(app App, apiURL string, base http.RoundTripper, now func() time.Time) (*ghinstallation.AppsTransport, error) {
	pem, err := os.ReadFile(app.PrivateKeyFile)
	if err != nil {
		return nil, fmt.Errorf("GitHub App private key: %w (download it from the App's settings page and set dispatcher.github.app.private_key_file)", err)
	}
	key, err := jwt.ParseRSAPrivateKeyFromPEM(pem)
	if err != nil {
		return nil, fmt.Errorf("GitHub App private key %s: %w", app.PrivateKeyFile, err)
	}
	if base == nil {
		base = http.DefaultTransport
	}
	if now == nil {
		now = time.Now
	}
	signer := skewProofSigner{inner: ghinstallation.NewRSASigner(jwt.SigningMethodRS256, key), now: now}
	atr, err := ghinstallation.NewAppsTransportWithOptions(base, app.ID, ghinstallation.WithSigner(signer))
	if err != nil {
		return nil, err
	}
	atr.BaseURL = strings.TrimSuffix(apiURL, "/")
	return atr, nil
}
