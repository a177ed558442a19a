// A small JSON service of the size Go services ship at: it links net/http, encoding/json,
// compress/gzip, crypto/sha256, regexp, text/template and html/template, so its binary is
// several megabytes with thousands of functions, the binary `agent/benches/gosym.rs` names
// pcs of (it only reads the file; it never runs it).
//
// Run, it serves on a loopback address for a number of seconds, and drives itself with a
// client so that every package above does work:
//
//	GET /items?q=REGEXP  items whose name matches, as JSON (gzipped when asked)
//	GET /digest?n=N      the SHA-256 of N generated items' JSON
//	GET /report          an HTML page rendered from a template
//
// Usage: goservice [address [seconds]], by default 127.0.0.1:0 for 10 seconds.
package main

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	htmltemplate "html/template"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/template"
	"time"
)

// Item is what the service stores and returns.
type Item struct {
	ID    int               `json:"id"`
	Name  string            `json:"name"`
	Price float64           `json:"price"`
	Tags  []string          `json:"tags"`
	Attrs map[string]string `json:"attrs,omitempty"`
}

// Catalog holds the items the handlers read, and counts what was asked of it.
type Catalog struct {
	mu       sync.RWMutex
	items    []Item
	requests map[string]int
}

var adjectives = []string{"red", "quick", "silent", "heavy", "bright", "plain", "rare", "cold"}
var nouns = []string{"kettle", "lamp", "anchor", "harbour", "violin", "ledger", "compass", "loom"}

func newCatalog(n int) *Catalog {
	c := &Catalog{requests: map[string]int{}}
	for i := 0; i < n; i++ {
		name := adjectives[i%len(adjectives)] + "-" + nouns[(i/len(adjectives))%len(nouns)] + "-" + strconv.Itoa(i)
		c.items = append(c.items, Item{
			ID:    i,
			Name:  name,
			Price: float64(i%97) * 1.25,
			Tags:  []string{adjectives[i%3], nouns[i%5]},
			Attrs: map[string]string{"batch": strconv.Itoa(i / 16)},
		})
	}
	return c
}

func (c *Catalog) count(path string) {
	c.mu.Lock()
	c.requests[path]++
	c.mu.Unlock()
}

// Matching returns the items whose name matches `pattern`.
func (c *Catalog) Matching(pattern *regexp.Regexp) []Item {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []Item
	for _, item := range c.items {
		if pattern.MatchString(item.Name) {
			out = append(out, item)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Price < out[j].Price })
	return out
}

func writeJSON(w http.ResponseWriter, r *http.Request, value any) {
	w.Header().Set("Content-Type", "application/json")
	var out io.Writer = w
	if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		defer zw.Close()
		out = zw
	}
	if err := json.NewEncoder(out).Encode(value); err != nil {
		log.Printf("encoding a response: %v", err)
	}
}

func (c *Catalog) handleItems(w http.ResponseWriter, r *http.Request) {
	c.count("/items")
	query := r.URL.Query().Get("q")
	if query == "" {
		query = "."
	}
	pattern, err := regexp.Compile(query)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	writeJSON(w, r, c.Matching(pattern))
}

func (c *Catalog) handleDigest(w http.ResponseWriter, r *http.Request) {
	c.count("/digest")
	n, err := strconv.Atoi(r.URL.Query().Get("n"))
	if err != nil || n <= 0 {
		n = 64
	}
	c.mu.RLock()
	if n > len(c.items) {
		n = len(c.items)
	}
	encoded, err := json.Marshal(c.items[:n])
	c.mu.RUnlock()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	sum := sha256.Sum256(encoded)
	writeJSON(w, r, map[string]any{"items": n, "sha256": hex.EncodeToString(sum[:])})
}

var summary = template.Must(template.New("summary").Parse(
	"{{range $path, $n := .}}{{$path}}: {{$n}} requests\n{{end}}"))

var page = htmltemplate.Must(htmltemplate.New("page").Parse(
	`<html><body><h1>{{.Title}}</h1><ul>{{range .Items}}<li>{{.Name}}: {{printf "%.2f" .Price}}</li>{{end}}</ul><pre>{{.Summary}}</pre></body></html>`))

func (c *Catalog) handleReport(w http.ResponseWriter, r *http.Request) {
	c.count("/report")
	c.mu.RLock()
	var text bytes.Buffer
	err := summary.Execute(&text, c.requests)
	items := c.items
	if len(items) > 20 {
		items = items[:20]
	}
	c.mu.RUnlock()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html")
	data := map[string]any{"Title": "goservice", "Items": items, "Summary": text.String()}
	if err := page.Execute(w, data); err != nil {
		log.Printf("rendering the report: %v", err)
	}
}

// drive asks the server for each of its pages in turn until `deadline`.
func drive(base string, deadline time.Time) {
	client := &http.Client{Timeout: 2 * time.Second}
	paths := []string{"/items?q=red-.*-1[0-9]", "/digest?n=200", "/report", "/items?q=loom"}
	for i := 0; time.Now().Before(deadline); i++ {
		req, err := http.NewRequest("GET", base+paths[i%len(paths)], nil)
		if err != nil {
			log.Fatal(err)
		}
		req.Header.Set("Accept-Encoding", "gzip")
		resp, err := client.Do(req)
		if err != nil {
			log.Printf("GET %s: %v", req.URL, err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		body := io.Reader(resp.Body)
		if resp.Header.Get("Content-Encoding") == "gzip" {
			if zr, err := gzip.NewReader(resp.Body); err == nil {
				body = zr
			}
		}
		_, _ = io.Copy(io.Discard, body)
		resp.Body.Close()
		time.Sleep(20 * time.Millisecond)
	}
}

func main() {
	address, seconds := "127.0.0.1:0", 10
	if len(os.Args) > 1 {
		address = os.Args[1]
	}
	if len(os.Args) > 2 {
		if n, err := strconv.Atoi(os.Args[2]); err == nil {
			seconds = n
		}
	}
	listener, err := net.Listen("tcp", address)
	if err != nil {
		log.Fatal(err)
	}
	catalog := newCatalog(2000)
	mux := http.NewServeMux()
	mux.HandleFunc("/items", catalog.handleItems)
	mux.HandleFunc("/digest", catalog.handleDigest)
	mux.HandleFunc("/report", catalog.handleReport)
	server := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := server.Serve(listener); err != nil && err != http.ErrServerClosed {
			log.Fatal(err)
		}
	}()
	fmt.Printf("goservice: serving on http://%s for %d s\n", listener.Addr(), seconds)
	drive("http://"+listener.Addr().String(), time.Now().Add(time.Duration(seconds)*time.Second))
	_ = server.Close()
	var text bytes.Buffer
	catalog.mu.RLock()
	_ = summary.Execute(&text, catalog.requests)
	catalog.mu.RUnlock()
	fmt.Print(text.String())
}
