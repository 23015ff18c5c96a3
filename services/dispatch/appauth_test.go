package dispatch_test

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-ci/berth/services/dispatch"
	"github.com/golang-jwt/jwt/v4"
)

// Given a GitHub App installation, when the dispatcher calls the API, then
// it first mints an installation token with a JWT whose iat is backdated by
// 60 s and whose exp is at most 10 minutes after iat (so a fast host clock
// cannot get it refused), signed RS256 with the App's key and issued by the
// App id, and then calls the API with that installation token.
func TestAppAuthMintsAnInstallationTokenWithASkewProofJWT(t *testing.T) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pemFile := filepath.Join(t.TempDir(), "app.pem")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	if err := os.WriteFile(pemFile, pemBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	root := repoRoot(t)
	tokenBody, err := os.ReadFile(filepath.Join(root, "..", "shared", "fixtures", "github", "api", "apps.installation-token.201.json"))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var jwtSeen, apiAuth string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/app/installations/42/access_tokens":
			jwtSeen = strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			w.Write(tokenBody)
		default:
			apiAuth = r.Header.Get("Authorization")
			w.Write([]byte(`{"total_count":0,"runners":[]}`))
		}
	}))
	defer srv.Close()

	now := time.Now()
	tr, err := dispatch.AppTransport(dispatch.App{ID: 7, InstallationID: 42, PrivateKeyFile: pemFile}, srv.URL+"/", nil, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	gh, err := dispatch.NewGitHubClient(srv.URL, "", &http.Client{Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := gh.Actions.ListOrganizationRunners(t.Context(), "example-org", nil); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	claims := &jwt.RegisteredClaims{}
	if _, err := jwt.ParseWithClaims(jwtSeen, claims, func(*jwt.Token) (any, error) { return &key.PublicKey, nil },
		jwt.WithoutClaimsValidation()); err != nil {
		t.Fatalf("JWT %q: %v", jwtSeen, err)
	}
	iat, exp := claims.IssuedAt.Time, claims.ExpiresAt.Time
	if back := now.Sub(iat); back < 59*time.Second || back > 61*time.Second {
		t.Errorf("iat backdated by %v, want 60 s", back)
	}
	if life := exp.Sub(iat); life > 10*time.Minute || life <= 0 {
		t.Errorf("exp - iat = %v, GitHub allows at most 10 min", life)
	}
	if claims.Issuer != "7" {
		t.Errorf("iss %q, want the App id 7", claims.Issuer)
	}
	if !strings.HasPrefix(apiAuth, "token ") || len(apiAuth) < 10 {
		t.Errorf("API called with %q, want the installation token", apiAuth)
	}
}
