// Package faultproxy is a TCP proxy between the service and PostgreSQL that
// breaks connections the ways networks and failovers do, for the fault tests.
//
// It reads the PostgreSQL wire protocol from the client only far enough to
// see each message's type and length, so it can act at the one moment that
// matters most to an idempotent API: when the client sends COMMIT; and from
// the server only until the session is ready, to learn which server process
// a cancel request names. Everything else is forwarded byte for byte. It supports plain connections only
// (sslmode=disable), which is what the tests use.
package faultproxy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
)

// Action is what the proxy does with a COMMIT.
type Action int

// The faults a COMMIT can meet.
const (
	// Forward passes the COMMIT and its reply.
	Forward Action = iota
	// CutBefore closes both sides without passing the COMMIT on: the server
	// rolls back, the client cannot know it did.
	CutBefore
	// CutAfter passes the COMMIT, then closes both sides before the reply:
	// the server commits, the client cannot know it did.
	CutAfter
	// SwallowReply passes the COMMIT and discards every reply on that
	// connection while keeping it open: the server commits, the client
	// waits until it gives up.
	SwallowReply
	// HalfOpen drops the COMMIT and goes silent in both directions while
	// keeping the server's side open, as a peer that vanished without a
	// FIN or RST looks to PostgreSQL: the transaction stays open, holding
	// its locks, until the server's own timeouts end the session. The server
	// side is held until Close, even after the client gives up.
	HalfOpen
)

func (a Action) String() string {
	switch a {
	case Forward:
		return "forward"
	case CutBefore:
		return "cut before COMMIT"
	case CutAfter:
		return "cut after COMMIT"
	case SwallowReply:
		return "swallowed COMMIT reply"
	case HalfOpen:
		return "half-open holder"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// Proxy forwards connections from its listener to a PostgreSQL server.
type Proxy struct {
	ln     net.Listener
	target string

	mu       sync.Mutex
	onCommit func() Action
	refuse   bool
	conns    map[*link]struct{}
	held     int // server sides kept open by HalfOpen
	refused  int // connections closed at once by Refuse
	gaveUp   int // forwarded COMMITs whose connection ended before any reply
	closed   bool
	wg       sync.WaitGroup
}

// Start listens on a free loopback port and forwards to target (host:port).
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Via returns databaseURL with its host and port replaced by the proxy's.
func (p *Proxy) Via(databaseURL string) (string, error) {
	u, err := url.Parse(databaseURL)
	if err != nil {
		return "", fmt.Errorf("parse database url: %w", err)
	}
	u.Host = p.Addr()
	return u.String(), nil
}

// OnCommit sets the function that decides each COMMIT's fate; nil forwards
// every COMMIT. It is called once per COMMIT with the proxy's lock held, so
// it must not call the proxy's methods.
func (p *Proxy) OnCommit(decide func() Action) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.onCommit = decide
}

// Refuse makes the proxy close new connections at once (true), as a database
// that is down or refusing connections does, or accept them again (false).
func (p *Proxy) Refuse(refuse bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = refuse
}

// CutAll closes every open connection on both sides, as a failover does.
// Server sides held by HalfOpen stay held.
func (p *Proxy) CutAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.conns {
		if !l.halfOpen {
			l.closeBoth()
		}
	}
}

// Held is how many server-side connections HalfOpen is holding open and the
// server has not ended yet.
func (p *Proxy) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

// Refused is how many connections Refuse has turned away.
func (p *Proxy) Refused() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused
}

// CommitsGivenUp is how many COMMITs the proxy forwarded untouched whose
// client stopped waiting before the server's reply reached the proxy: it
// sent a cancel request for the session (pgx does, when a query's context
// ends) or the connection ended (or was cut by CutAll) first. The client
// cannot know those outcomes either, without any fault at the COMMIT.
func (p *Proxy) CommitsGivenUp() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gaveUp
}

// Close stops accepting, closes every connection, held ones included, and
// waits for the proxy's goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for l := range p.conns {
		l.closeBoth()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse, closed := p.refuse, p.closed
		p.mu.Unlock()
		if refuse || closed {
			client.Close()
			p.mu.Lock()
			p.refused++
			p.mu.Unlock()
			continue
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		l := &link{client: client, server: server}
		p.mu.Lock()
		p.conns[l] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.clientToServer(l)
		go p.serverToClient(l)
	}
}

// link is one proxied connection.
type link struct {
	client, server net.Conn

	// Guarded by the proxy's mutex.
	swallow  bool // discard what the server sends
	halfOpen bool // forward nothing either way; hold the server side
	// awaiting: a COMMIT was forwarded untouched and no reply has come yet.
	awaiting bool
	// backendPID is the server process of the session (BackendKeyData),
	// which a cancel request names.
	backendPID uint32
	once       sync.Once
}

func (l *link) closeBoth() {
	l.once.Do(func() {
		l.client.Close()
		l.server.Close()
	})
}

// Protocol codes of the untyped messages a session can begin with.
const (
	sslRequest    = 80877103
	gssEncRequest = 80877104
	cancelRequest = 80877102
)

func (p *Proxy) clientToServer(l *link) {
	defer p.wg.Done()
	defer p.drop(l, false)
	// The startup phase: untyped messages (length, then code). An SSL or
	// GSS request is answered with one byte and followed by another
	// untyped message.
	for {
		msg, err := readUntyped(l.client)
		if err != nil {
			return
		}
		code := binary.BigEndian.Uint32(msg[4:8])
		if code == cancelRequest && len(msg) >= 12 {
			// Noted before it is forwarded: once the server has it, the
			// cancelled COMMIT's error reply can come back, and clear the
			// wait, before this goroutine runs again (a CI failure on a
			// busy machine: 0 given up where 1 was).
			p.cancelled(binary.BigEndian.Uint32(msg[8:12]))
		}
		if _, err := l.server.Write(msg); err != nil {
			return
		}
		if code != sslRequest && code != gssEncRequest {
			break
		}
	}
	for {
		msg, err := readTyped(l.client)
		if err != nil {
			return
		}
		action := Forward
		commit := isCommit(msg)
		if commit {
			p.mu.Lock()
			if p.onCommit != nil {
				action = p.onCommit()
			}
			p.mu.Unlock()
		}
		switch action {
		case CutBefore:
			l.closeBoth()
			return
		case HalfOpen:
			p.mu.Lock()
			l.halfOpen = true
			p.held++
			p.mu.Unlock()
			// The client may close its side; the server's stays open.
			_, _ = io.Copy(io.Discard, l.client)
			return
		}
		switch action {
		case CutAfter, SwallowReply:
			// Silence the reply before the COMMIT leaves: a COMMIT with
			// nothing to flush is answered in microseconds, and a reply that
			// slipped through would make the fault no fault.
			p.mu.Lock()
			l.swallow = true
			p.mu.Unlock()
		case Forward:
			if commit {
				p.mu.Lock()
				l.awaiting = true
				p.mu.Unlock()
			}
		}
		if _, err := l.server.Write(msg); err != nil {
			return
		}
		if action == CutAfter {
			// Let the server read the COMMIT before it sees the close; it
			// processes what it has read in order.
			if tcp, ok := l.server.(*net.TCPConn); ok {
				_ = tcp.CloseWrite()
			}
			l.client.Close()
			return
		}
	}
}

// cancelled notes a cancel request for the session of server process pid:
// a COMMIT it is still waiting for is one its client gave up on.
func (p *Proxy) cancelled(pid uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.conns {
		if l.backendPID == pid && l.awaiting {
			l.awaiting = false
			p.gaveUp++
		}
	}
}

func (p *Proxy) serverToClient(l *link) {
	defer p.wg.Done()
	defer p.drop(l, true)
	// The startup, read whole messages until the session is ready, to learn
	// its server process (BackendKeyData). The first message is an
	// authentication request, an error or a protocol negotiation; a single
	// byte before it answers an SSL or GSS request.
	for started := false; ; {
		kind := make([]byte, 1)
		if _, err := io.ReadFull(l.server, kind); err != nil {
			return
		}
		if !started && (kind[0] == 'N' || kind[0] == 'S' || kind[0] == 'G') {
			if _, err := l.client.Write(kind); err != nil {
				return
			}
			continue
		}
		started = true
		msg, err := readTypedRest(l.server, kind[0])
		if err != nil {
			return
		}
		if msg[0] == 'K' && len(msg) >= 9 {
			p.mu.Lock()
			l.backendPID = binary.BigEndian.Uint32(msg[5:9])
			p.mu.Unlock()
		}
		if _, err := l.client.Write(msg); err != nil {
			return
		}
		if msg[0] == 'Z' {
			break
		}
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := l.server.Read(buf)
		if n > 0 {
			p.mu.Lock()
			silent := l.swallow || l.halfOpen
			l.awaiting = false // the reply has come
			p.mu.Unlock()
			if !silent {
				if _, werr := l.client.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// drop closes a link once either direction ends. A link HalfOpen holds keeps
// its server side open until the server ends it or the proxy closes.
func (p *Proxy) drop(l *link, serverEnded bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l.halfOpen && !serverEnded && !p.closed {
		l.client.Close()
		return
	}
	if l.halfOpen {
		l.halfOpen = false
		p.held--
	}
	if l.awaiting {
		l.awaiting = false
		p.gaveUp++
	}
	l.closeBoth()
	delete(p.conns, l)
}

// maxMessage bounds a message the proxy will buffer. The service's largest
// is a stored response of a few hundred KiB; 64 MiB is generous.
const maxMessage = 64 << 20

var errTooLarge = errors.New("faultproxy: message too large")

func readUntyped(r io.Reader) ([]byte, error) {
	head := make([]byte, 4)
	if _, err := io.ReadFull(r, head); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(head)
	if n < 8 || n > maxMessage {
		return nil, errTooLarge
	}
	msg := make([]byte, n)
	copy(msg, head)
	_, err := io.ReadFull(r, msg[4:])
	return msg, err
}

func readTyped(r io.Reader) ([]byte, error) {
	kind := make([]byte, 1)
	if _, err := io.ReadFull(r, kind); err != nil {
		return nil, err
	}
	return readTypedRest(r, kind[0])
}

// readTypedRest reads the rest of a typed message whose type byte was kind.
func readTypedRest(r io.Reader, kind byte) ([]byte, error) {
	head := []byte{kind, 0, 0, 0, 0}
	if _, err := io.ReadFull(r, head[1:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(head[1:])
	if n < 4 || n > maxMessage {
		return nil, errTooLarge
	}
	msg := make([]byte, 1+n)
	copy(msg, head)
	_, err := io.ReadFull(r, msg[5:])
	return msg, err
}

// isCommit reports whether msg is a simple Query whose text is COMMIT, how
// pgx sends it.
func isCommit(msg []byte) bool {
	if msg[0] != 'Q' {
		return false
	}
	text := bytes.TrimRight(msg[5:], "\x00")
	text = bytes.TrimSpace(bytes.TrimRight(bytes.TrimSpace(text), ";"))
	return bytes.EqualFold(text, []byte("commit"))
}
