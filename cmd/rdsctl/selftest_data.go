package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/srvlab/rds-csi/pkg/nvme"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// dataPath reaches a scratch disk's data the way a node does: connected to
// its export as one host NQN. The self-test uses it to check that a copy
// holds its source's data.
// An export with a password (issue 26) is reached with its secret; a zero
// secret connects without authentication.
type dataPath interface {
	write(ctx context.Context, nqn, hostNQN string, secret nvme.DHCHAPSecret, off int64, p []byte) error
	read(ctx context.Context, nqn, hostNQN string, secret nvme.DHCHAPSecret, off int64, n int) ([]byte, error)
	describe() string
}

// nvmeDataPath connects over NVMe/TCP with the kernel's initiator (the
// driver's node code, pkg/nvme), for one read or write at a time, and
// disconnects after it.
type nvmeDataPath struct {
	c       connector
	address string
	port    int
}

// connector is what the data path needs of nvme.TCPConnector.
type connector interface {
	Connect(ctx context.Context, t nvme.Target) (string, error)
	Disconnect(ctx context.Context, nqn string, inUse nvme.InUseFunc) error
}

func newNVMeDataPath(nqnPrefix, address string, port int) (*nvmeDataPath, error) {
	c, err := nvme.NewTCPConnector(nvme.Config{NQNPrefix: nqnPrefix, CtrlLossTimeout: 10 * time.Second, FastIOFailTimeout: 5 * time.Second})
	if err != nil {
		return nil, err
	}
	return &nvmeDataPath{c: c, address: address, port: port}, nil
}

func (p *nvmeDataPath) describe() string {
	return fmt.Sprintf("NVMe/TCP to %s:%d", p.address, p.port)
}

func (p *nvmeDataPath) session(ctx context.Context, nqn, hostNQN string, secret nvme.DHCHAPSecret, flag int, fn func(*os.File) error) (err error) {
	dev, err := p.c.Connect(ctx, nvme.Target{Address: p.address, Port: p.port, NQN: nqn, HostNQN: hostNQN, Secret: secret})
	if err != nil {
		return fmt.Errorf("connecting to %s over NVMe/TCP (%s:%d) as this run's host: %w", nqn, p.address, p.port, err)
	}
	defer func() {
		notInUse := func(context.Context, string) (bool, error) { return false, nil }
		if derr := p.c.Disconnect(context.WithoutCancel(ctx), nqn, notInUse); derr != nil {
			err = errors.Join(err, fmt.Errorf("disconnecting %s: %w", nqn, derr))
		}
	}()
	f, err := os.OpenFile(dev, flag, 0)
	if err != nil {
		return err
	}
	if err := fn(f); err != nil {
		f.Close()
		return fmt.Errorf("%s (%s): %w", dev, nqn, err)
	}
	return f.Close()
}

func (p *nvmeDataPath) write(ctx context.Context, nqn, hostNQN string, secret nvme.DHCHAPSecret, off int64, b []byte) error {
	return p.session(ctx, nqn, hostNQN, secret, os.O_RDWR, func(f *os.File) error {
		if _, err := f.WriteAt(b, off); err != nil {
			return err
		}
		return f.Sync()
	})
}

func (p *nvmeDataPath) read(ctx context.Context, nqn, hostNQN string, secret nvme.DHCHAPSecret, off int64, n int) ([]byte, error) {
	b := make([]byte, n)
	err := p.session(ctx, nqn, hostNQN, secret, os.O_RDONLY, func(f *os.File) error {
		_, err := f.ReadAt(b, off)
		return err
	})
	return b, err
}

// dataPattern is what the data check writes: random, so that nothing but
// a copy of this very write can match it.
const dataOffset, dataLen = 4 * rds.MiB, 64 * 1024

// otherHostWait bounds the connect of a host the export must refuse.
const otherHostWait = 20 * time.Second

// dataWrite writes the pattern to the scratch disk, open to host, and
// checks that another host (other, made up for this run too) is refused.
func (st *selftestRun) dataWrite(nqn, host, other string) {
	st.check("data: write a pattern to the volume", func() (string, error) {
		p := make([]byte, dataLen)
		if _, err := rand.Read(p); err != nil {
			return "", err
		}
		if err := st.o.data.write(st.ctx, nqn, host, nvme.DHCHAPSecret{}, dataOffset, p); err != nil {
			return "", err
		}
		st.pattern = p
		return fmt.Sprintf("%d random bytes at %d over %s", len(p), dataOffset, st.o.data.describe()), nil
	})
	st.check("data: another host is refused", func() (string, error) {
		ctx, cancel := context.WithTimeout(st.ctx, otherHostWait)
		defer cancel()
		_, err := st.o.data.read(ctx, nqn, other, nvme.DHCHAPSecret{}, dataOffset, 512)
		if err == nil {
			st.fact("allow-host-enforced", contradicted, "a host other than the allowed one connected and read the disk")
			return "", fmt.Errorf("a host other than the allowed one connected to %s and read it: the allowed host is not enforced", nqn)
		}
		if st.ctx.Err() != nil {
			return "", err
		}
		st.fact("allow-host-enforced", confirmed, "the allowed host connected; another was refused (%v)", err)
		return "refused: " + err.Error(), nil
	})
}

// dataCompare reads the restore (a copy of a copy, its sources deleted),
// open to host, where the pattern was written, and compares.
func (st *selftestRun) dataCompare(nqn, host string) {
	st.check("data: the restore holds the volume's data", func() (string, error) {
		got, err := st.o.data.read(st.ctx, nqn, host, nvme.DHCHAPSecret{}, dataOffset, dataLen)
		if err != nil {
			return "", err
		}
		if bytes.Equal(got, st.pattern) {
			st.fact("copy-data", confirmed, "the %d bytes written to the volume read back from its restore (volume -> snapshot -> restore, both sources deleted)", dataLen)
			st.fact("copy-independent", confirmed, "the restore kept the data after its source volume and snapshot were deleted")
			return fmt.Sprintf("%d bytes equal", dataLen), nil
		}
		same, zeros := 0, 0
		for i := range got {
			if got[i] == st.pattern[i] {
				same++
			}
			if got[i] == 0 {
				zeros++
			}
		}
		st.fact("copy-data", contradicted, "the restore holds %d of %d bytes of the pattern (%d zero bytes): copy-from did not copy the data; run the driver with --copy-from-data=unsupported", same, dataLen, zeros)
		return "", fmt.Errorf("the restore holds %d of the %d bytes written (%d zero bytes): /disk add copy-from did not copy the data; run the driver with --copy-from-data=unsupported", same, dataLen, zeros)
	})
}
