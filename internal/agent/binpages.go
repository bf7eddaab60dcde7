package agent

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// The agent's binary is mapped from its file, and the kernel keeps every
// page of it the process touched, and the pages around each (it maps 64 KiB
// around a fault), resident until memory runs short: an idle agent holds
// 26 MiB of its 30 MiB of code, read-only data and function tables, most
// of them touched once, by the start alone (the packages' init, the first
// listing, the snapshot, the NATS server's start, the kubelet's config
// types), against 16 MiB that an agent that has run for minutes touches
// again. pageOutBinary gives those pages back, once every package's init
// has run (before the first listing peaks) and once more when the first
// listing is applied: the kernel drops them from memory (the file's pages,
// clean, are read again if ever needed), and what the agent runs next
// comes back at its first touch. Paging out while the first listing runs
// made its code come back from the disk, in the middle of a restart.

// returnBinaryPages pages the binary out (pageOutBinary) and logs msg with
// the file-backed RSS before and after.
func returnBinaryPages(log zerolog.Logger, msg string) {
	before, after, err := pageOutBinary()
	if err != nil {
		log.Info().Err(err).Msg("the binary's pages stay resident")
		return
	}
	log.Info().Int64("file_rss_before_bytes", before).Int64("file_rss_after_bytes", after).Msg(msg)
}

// pageOutBinary pages out every read-only mapping of the executable
// (MADV_PAGEOUT, Linux 5.4 and later) and returns the process's
// file-backed RSS before and after.
func pageOutBinary() (before, after int64, err error) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return 0, 0, err
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return 0, 0, err
	}
	if before, err = rssFile(); err != nil {
		return 0, 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		// start-end perms offset dev inode path
		f := strings.Fields(sc.Text())
		if len(f) < 6 || strings.Join(f[5:], " ") != exe || f[1][1] == 'w' {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if !ok || err1 != nil || err2 != nil || end <= start {
			return before, 0, fmt.Errorf("/proc/self/maps: %q", sc.Text())
		}
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, uintptr(start), uintptr(end-start), unix.MADV_PAGEOUT); errno != 0 {
			return before, 0, fmt.Errorf("madvise %s pageout: %w", f[0], errno)
		}
	}
	after, err = rssFile()
	return before, after, err
}

// rssFile is the process's resident file-backed memory (RssFile), bytes.
func rssFile() (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "RssFile:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("/proc/self/status: no RssFile")
}
