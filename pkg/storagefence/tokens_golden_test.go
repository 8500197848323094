package storagefence

import (
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/srvlab/rds-csi/pkg/rds"
)

// The derivations behind storage fencing are stored formats: the RDS of a
// running cluster holds their results. Each live export allows the host
// NQN attachmentNQN derived for its claim's nonce under the attachment
// key (itself derived from the RDS SSH key by default) and has the
// password exportPassword derived for that host; a parked export's host
// carries parkMAC. A controller of the next release (or of the previous
// one, after a rollback) must derive the same values from the same
// claims, or it reads every live attachment as unclaimed: it answers the
// holders with NQNs and secrets the RDS does not have, and its reconcile
// moves or closes every export. These vectors are what the releases up to
// this one derive (computed by the previous release's code, 8911e3c, and
// by this one); a change to a label, separator or encoding fails here,
// and must come with a migration and an Upgrading section instead.
func TestDerivationsGiveWhatLiveExportsHold(t *testing.T) {
	const (
		handle = "pvc-2f000000-0000-4000-8000-000000000009"
		nonce  = "00112233445566778899aabbccddeeff"
	)
	sshKey := filepath.Join(t.TempDir(), "id_ed25519")
	if err := os.WriteFile(sshKey, []byte("-----BEGIN OPENSSH PRIVATE KEY-----\nnot a real key, a fixed input\n-----END OPENSSH PRIVATE KEY-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	key, err := LoadAttachmentKey("", sshKey)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := hex.EncodeToString(key), wantAttachmentKey; got != want {
		t.Errorf("the attachment key derived from the SSH key is %s; releases derive %s", got, want)
	}
	host := attachmentNQN(key, handle, "node-a", nonce)
	if host != wantAttachmentNQN {
		t.Errorf("attachmentNQN = %s; releases derive %s", host, wantAttachmentNQN)
	}
	pw, err := exportPassword(key, handle, host)
	if err != nil {
		t.Fatal(err)
	}
	want, err := rds.NewExportPassword(wantExportPassword)
	if err != nil {
		t.Fatal(err)
	}
	if !pw.Equal(want) {
		t.Errorf("exportPassword differs from what releases derive for %s on %s", handle, host)
	}
	if !parkedFrom(key, handle, wantParkedNQN, host) {
		t.Errorf("%s, a park of %s on its way from %s as releases make it, is not seen as one", wantParkedNQN, handle, host)
	}
}

// The vectors: an SSH key file of fixed content, the volume handle, node
// and nonce above.
const (
	wantAttachmentKey  = "f6ab6a9e08ff234f3fd20908f76d6cda7e7508d81e555f69cfafd5f8608830ef"
	wantAttachmentNQN  = "nqn.2014-08.org.nvmexpress:uuid:09f5f641-8ab1-4bef-b6ff-270ee93acfaf"
	wantExportPassword = "fkqrxszf7nyyufuinlootnzlw6xtcxoi2wnqfzaxkly3lxessiaa"
	wantParkedNQN      = "nqn.2014-08.org.nvmexpress:uuid:795f0a48-b161-4bad-812e-3b6bba3b7069"
)
