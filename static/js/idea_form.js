// The idea form: ask before submitting for a GPU kind with no worker online (its search would
// wait for one). The server accepts either way; this only makes the wait a choice.
(function () {
  function offlineKinds(form) {
    const boxes = form.querySelectorAll('input[name="target_kinds"]');
    if (!boxes.length) return [];
    const online = (boxes[0].dataset.online || "").split(" ").filter(Boolean);
    return Array.from(boxes)
      .filter((box) => box.checked && !online.includes(box.value))
      .map((box) => box.value);
  }

  function message(kinds) {
    return (
      "No " + kinds.join(", ") + " worker is online now. A search for it waits until one " +
      "starts.\n\nSubmit the idea anyway?"
    );
  }

  document.addEventListener("htmx:confirm", function (evt) {
    const form = evt.detail.elt;
    if (!form || form.id !== "idea-form") return;
    const kinds = offlineKinds(form);
    if (!kinds.length) return;
    evt.preventDefault();
    if (window.confirm(message(kinds))) evt.detail.issueRequest(true);
  });
})();
