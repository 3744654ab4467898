// The idea form: ask before submitting for a GPU kind with no worker online (its search would
// wait for one). Yes ticks the form's "Submit even if no worker ... is online" box, which the
// server asks for itself when the box is not ticked (so the form asks without this script too).
(function () {
  function offlineKinds(form) {
    const boxes = form.querySelectorAll('input[name="target_kinds"]');
    if (!boxes.length) return [];
    if (boxes[0].dataset.online === undefined) return []; // unknown: Redis is unreachable
    const online = boxes[0].dataset.online.split(" ").filter(Boolean);
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
    const anyway = form.querySelector('input[name="start_anyway"]');
    const kinds = offlineKinds(form);
    if (!kinds.length || (anyway && anyway.checked)) return;
    evt.preventDefault();
    if (!window.confirm(message(kinds))) return;
    if (anyway) anyway.checked = true;
    evt.detail.issueRequest(true);
  });
})();
